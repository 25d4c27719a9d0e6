//! People signed in at an identity provider, over real gRPC on loopback: a JWT signed by a key
//! of the provider's key set (JWKS file), for this issuer and audience, signs its holder in with
//! the role its groups map to; the name recorded as `by` is the token's, never the client's;
//! expired, foreign, forged and algorithm-swapped tokens are refused and logged; a rotated key
//! set takes effect without a restart; tokens of the tokens file keep working beside JWTs.
#![allow(clippy::unwrap_used)]

mod auth_support;
mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use auth_support::*;
use base64::Engine;
use cairn_orchestrator::auth::Role;
use cairn_proto::v1::{
    GateDecisionRequest, GetRunRequest, SubmitRunRequest, TaskState, WhoAmIRequest,
};
use common::{data, read_events, PROJECT};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tonic::Code;

const ISSUER: &str = "https://idp.example.test/realms/cairn";
const AUDIENCE: &str = "cairn-orchestrator";

/// An identity provider's signing key (EC P-256) and its public JWK.
struct Idp {
    kid: String,
    key: EncodingKey,
    jwk: Value,
}

impl Idp {
    fn new(kid: &str) -> Idp {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let raw = pair.public_key_raw();
        assert_eq!((raw.len(), raw[0]), (65, 4), "an uncompressed P-256 point");
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        Idp {
            kid: kid.into(),
            key: EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
            jwk: json!({
                "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
                "x": b64(&raw[1..33]), "y": b64(&raw[33..]),
            }),
        }
    }

    fn sign(&self, claims: &Value) -> String {
        let mut h = Header::new(Algorithm::ES256);
        h.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&h, claims, &self.key).unwrap()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Claims of a person in `groups`, valid for ten minutes.
fn claims(email: &str, groups: &[&str]) -> Value {
    json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": format!("id-{email}"), "email": email,
        "groups": groups, "iat": now(), "exp": now() + 600,
    })
}

fn write_jwks(path: &std::path::Path, keys: &[&Idp]) {
    let set = json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()});
    std::fs::write(path, serde_json::to_vec(&set).unwrap()).unwrap();
}

/// A store and an orchestrator taking the tokens file and JWTs of `idp`: the group
/// `cairn-approvers` maps to approver, `cairn-operators` to operator, names from `email`.
async fn start(idp: &Idp) -> (Secured, std::path::PathBuf) {
    let mut jwks = None;
    let s = Secured::start_with(true, |config, dir| {
        let path = dir.join("jwks.json");
        write_jwks(&path, &[idp]);
        let j = &mut config.auth.jwt;
        j.jwks_file = path.display().to_string();
        j.issuer = ISSUER.into();
        j.audience = AUDIENCE.into();
        j.name_claim = "email".into();
        j.role_claim = "groups".into();
        j.role_map = [
            ("cairn-approvers".to_owned(), Role::Approver),
            ("cairn-operators".to_owned(), Role::Operator),
        ]
        .into();
        jwks = Some(path);
    })
    .await;
    (s, jwks.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_jwt_signs_a_person_in_with_the_role_of_their_groups() {
    let idp = Idp::new("key-1");
    let (s, _) = start(&idp).await;
    let mut c = s.client();
    let olga = idp.sign(&claims("olga@example.test", &["staff", "cairn-operators"]));
    let anna = idp.sign(&claims(
        "anna@example.test",
        &["cairn-operators", "cairn-approvers"],
    ));

    let me = c
        .who_am_i(as_(&anna, WhoAmIRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(me.name, "anna@example.test");
    assert_eq!(me.role, "approver", "the highest role of her groups");

    let run = c
        .submit_run(as_(
            &olga,
            SubmitRunRequest {
                project_id: PROJECT.into(),
                graph_yaml: GATED.into(),
                by: "mallory".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    s.wait_state(PROJECT, &run, TaskState::InputRequired).await;

    // An operator may not decide gates; an approver may.
    let decide = |by: &str| GateDecisionRequest {
        project_id: PROJECT.into(),
        run_id: run.clone(),
        gate_id: "review".into(),
        by: by.into(),
        note: "ok".into(),
    };
    let e = c
        .approve_gate(as_(&olga, decide("mallory")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let info = c
        .approve_gate(as_(&anna, decide("mallory")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.gates[0].decided_by, "anna@example.test");
    s.wait_state(PROJECT, &run, TaskState::Completed).await;
    let events = read_events(&s.store, &run).await;
    let by_of = |kind: &str| data(events.iter().find(|e| e.r#type == kind).unwrap())["by"].clone();
    assert_eq!(by_of("task.created"), "olga@example.test");
    assert_eq!(by_of("gate.approved"), "anna@example.test");
    assert!(!events.iter().any(|e| e.data_json.contains("mallory")));

    // Tokens of the tokens file work beside JWTs.
    let me = c
        .who_am_i(as_(&s.token("vic"), WhoAmIRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((me.name.as_str(), me.role.as_str()), ("vic", "viewer"));

    // A projects claim scopes the person to those projects.
    let mut scoped = claims("sam@example.test", &["cairn-approvers"]);
    scoped["cairn_projects"] = json!([OTHER]);
    let e = c
        .get_run(as_(
            &idp.sign(&scoped),
            GetRunRequest {
                project_id: PROJECT.into(),
                run_id: run.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // An empty list is no project at all, not every project.
    scoped["cairn_projects"] = json!([]);
    let e = c
        .who_am_i(as_(&idp.sign(&scoped), WhoAmIRequest {}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_foreign_forged_and_algorithm_swapped_jwts_are_refused_and_logged() {
    let idp = Idp::new("key-1");
    let (s, _) = start(&idp).await;
    let mut c = s.client();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);

    let good = claims("eve@example.test", &["cairn-approvers"]);
    let with = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        c
    };
    // The same kid, another private key: a forged signature.
    let forger = Idp::new("key-1");
    // HS256 keyed with the public key's bytes (the classic algorithm swap).
    let swapped = {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("key-1".into());
        let secret = serde_json::to_vec(&idp.jwk).unwrap();
        jsonwebtoken::encode(&h, &good, &EncodingKey::from_secret(&secret)).unwrap()
    };
    let unsigned = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"JWT","kid":"key-1"}"#),
        b64(&serde_json::to_vec(&good).unwrap())
    );
    let tampered = {
        let t = idp.sign(&good);
        let parts: Vec<&str> = t.split('.').collect();
        let payload = b64(&serde_json::to_vec(&with("groups", json!(["cairn-admins"]))).unwrap());
        format!("{}.{payload}.{}", parts[0], parts[2])
    };
    let cases: Vec<(&str, String)> = vec![
        ("expired", idp.sign(&with("exp", json!(now() - 3600)))),
        ("not yet valid", idp.sign(&with("nbf", json!(now() + 3600)))),
        ("no expiry", {
            let mut c = good.clone();
            c.as_object_mut().unwrap().remove("exp");
            idp.sign(&c)
        }),
        (
            "another issuer",
            idp.sign(&with("iss", json!("https://evil.test"))),
        ),
        (
            "another audience",
            idp.sign(&with("aud", json!("some-other-app"))),
        ),
        ("a key not in the set", Idp::new("key-9").sign(&good)),
        ("a forged signature", forger.sign(&good)),
        ("HS256 with the public key", swapped),
        ("alg none", unsigned),
        ("a tampered payload", tampered),
        (
            "no mapped group",
            idp.sign(&with("groups", json!(["staff"]))),
        ),
        ("no name", {
            let mut c = good.clone();
            c.as_object_mut().unwrap().remove("email");
            idp.sign(&c)
        }),
    ];
    for (what, token) in &cases {
        let e = c
            .who_am_i(as_(token, WhoAmIRequest {}))
            .await
            .expect_err(what);
        assert_eq!(e.code(), Code::Unauthenticated, "{what}: {e:?}");
        assert!(
            !e.message().contains(token.as_str()),
            "{what}: token echoed"
        );
    }
    assert!(
        !logged().contains("eve@example.test"),
        "no refused token's name is taken as who called"
    );
    assert!(logged().contains("anonymous") && logged().contains("WhoAmI"));
    // The good token itself passes.
    let me = c
        .who_am_i(as_(&idp.sign(&good), WhoAmIRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(me.name, "eve@example.test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_set_takes_effect_without_a_restart_and_a_broken_one_is_ignored() {
    let old = Idp::new("key-1");
    let (s, jwks) = start(&old).await;
    let mut c = s.client();
    let who = |t: String| as_(&t, WhoAmIRequest {});
    c.who_am_i(who(
        old.sign(&claims("a@example.test", &["cairn-operators"]))
    ))
    .await
    .unwrap();

    let new = Idp::new("key-2");
    write_jwks(&jwks, &[&new]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = c
            .who_am_i(who(
                new.sign(&claims("a@example.test", &["cairn-operators"]))
            ))
            .await;
        if r.is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "new key never taken: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let e = c
        .who_am_i(who(
            old.sign(&claims("a@example.test", &["cairn-operators"]))
        ))
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Code::Unauthenticated,
        "the retired key is refused"
    );

    // A half-written key set keeps the keys read before.
    std::fs::write(&jwks, b"{\"keys\": [").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.who_am_i(who(
        new.sign(&claims("a@example.test", &["cairn-operators"]))
    ))
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_setting_without_issuer_or_with_a_symmetric_key_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    let idp = Idp::new("k");
    write_jwks(&jwks, &[&idp]);
    let config = |issuer: &str| {
        let mut c = cairn_orchestrator::Config {
            store_addr: "127.0.0.1:9".into(),
            ingest_addr: String::new(),
            ..Default::default()
        };
        c.auth.jwt.jwks_file = jwks.display().to_string();
        c.auth.jwt.issuer = issuer.into();
        c.auth.jwt.audience = AUDIENCE.into();
        c
    };
    let err = cairn_orchestrator::orchestrator_service(config(""))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("auth.jwt.issuer"), "{err}");
    std::fs::write(
        &jwks,
        br#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"s","alg":"HS256"}]}"#,
    )
    .unwrap();
    let err = cairn_orchestrator::orchestrator_service(config(ISSUER))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("symmetric"), "{err}");
}
