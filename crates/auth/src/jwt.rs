//! People signed in at an identity provider (OIDC): a bearer JWT is verified against the
//! provider's public keys (a JWKS file the operator keeps current), its issuer and this
//! orchestrator's audience; one claim names the person (recorded as `by`), one the role (or
//! groups mapped to roles), one the projects.
//!
//! Only asymmetric keys and algorithms are accepted (RSA, EC, Ed25519): a JWKS is public, so a
//! symmetric (`oct`) key in it, or an HS* token, is refused. A key's algorithm must match the
//! token's, so a token cannot pick how its own signature is checked.

use std::collections::BTreeMap;
use std::path::Path;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::watched::Watched;
use super::{Caller, Role};

/// `[auth.jwt]` of the orchestrator's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtConfig {
    /// The identity provider's public keys (`{"keys": [...]}`, as its `jwks_uri` serves
    /// them), re-read when the file changes; empty = JWTs are not accepted.
    pub jwks_file: String,
    /// The `iss` every token must carry (required with `jwks_file`).
    pub issuer: String,
    /// The `aud` every token must carry: this orchestrator's client id at the provider
    /// (required with `jwks_file`).
    pub audience: String,
    /// The claim recorded as the person's name (`by`).
    pub name_claim: String,
    /// The claim holding the role: a role name, or with `role_map` names to map (a string or
    /// a list; the highest role wins).
    pub role_claim: String,
    /// Values of `role_claim` (such as group names) and the role each gives; empty = the
    /// claim holds role names (viewer, operator, approver, admin).
    pub role_map: BTreeMap<String, Role>,
    /// The claim listing the projects the person may act on (a string or a list); absent in
    /// a token = every project.
    pub projects_claim: String,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_s: u64,
}

impl Default for JwtConfig {
    fn default() -> Self {
        JwtConfig {
            jwks_file: String::new(),
            issuer: String::new(),
            audience: String::new(),
            name_claim: "sub".into(),
            role_claim: "cairn_role".into(),
            role_map: BTreeMap::new(),
            projects_claim: "cairn_projects".into(),
            leeway_s: 60,
        }
    }
}

impl JwtConfig {
    pub fn is_on(&self) -> bool {
        !self.jwks_file.trim().is_empty()
    }
}

/// Whether a bearer token has the shape of a JWT (header.payload.signature); tokens of the
/// tokens file never contain a dot.
pub fn looks_like_jwt(token: &str) -> bool {
    token.split('.').count() == 3
}

/// One usable key of the set.
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// The keys of a JWKS file.
struct Keys(Vec<Key>);

impl Keys {
    fn read(path: &Path) -> Result<Keys, String> {
        let text =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let set: JwkSet = serde_json::from_slice(&text).map_err(|e| {
            format!(
                "{} is not a JWKS (`{{\"keys\": [...]}}`): {e}",
                path.display()
            )
        })?;
        let mut keys = Vec::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            let kid = jwk.common.key_id.clone();
            let name = kid.clone().unwrap_or_else(|| format!("#{i}"));
            let alg =
                algorithm_of(jwk).map_err(|e| format!("{}: key {name}: {e}", path.display()))?;
            let key = DecodingKey::from_jwk(jwk)
                .map_err(|e| format!("{}: key {name}: {e}", path.display()))?;
            keys.push(Key { kid, alg, key });
        }
        if keys.is_empty() {
            return Err(format!("{} holds no keys", path.display()));
        }
        Ok(Keys(keys))
    }
}

/// The algorithm a key verifies: its `alg`, else the one its type and curve imply.
fn algorithm_of(jwk: &Jwk) -> Result<Algorithm, String> {
    let implied = match &jwk.algorithm {
        AlgorithmParameters::OctetKey(_) => {
            return Err("symmetric (`oct`) keys are refused: a key set is public".into())
        }
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => Algorithm::ES256,
            EllipticCurve::P384 => Algorithm::ES384,
            ref c => return Err(format!("curve {c:?} is not supported")),
        },
        AlgorithmParameters::OctetKeyPair(_) => Algorithm::EdDSA,
        _ => return Err("this key type is not supported".into()),
    };
    let alg = match jwk.common.key_algorithm {
        Some(a) => Algorithm::try_from(a).map_err(|e| format!("algorithm {a:?}: {e}"))?,
        None => implied,
    };
    if alg.family() == jsonwebtoken::AlgorithmFamily::Hmac {
        return Err("HMAC algorithms are refused: a key set is public".into());
    }
    Ok(alg)
}

/// Verifies bearer JWTs and maps their claims to a [`Caller`].
pub struct JwtVerifier {
    config: JwtConfig,
    keys: Watched<Keys>,
}

impl JwtVerifier {
    /// Checks the settings and reads the key set; every mistake is named.
    pub fn new(config: &JwtConfig) -> Result<JwtVerifier, String> {
        for (key, value) in [
            ("issuer", &config.issuer),
            ("audience", &config.audience),
            ("name_claim", &config.name_claim),
            ("role_claim", &config.role_claim),
        ] {
            if value.trim().is_empty() {
                return Err(format!(
                    "auth.jwt.{key} must be set when auth.jwt.jwks_file is (tokens are checked against it)"
                ));
            }
        }
        let keys = Watched::open(Path::new(config.jwks_file.trim()), "JWKS file", Keys::read)
            .map_err(|e| format!("auth.jwt.jwks_file: {e}"))?;
        Ok(JwtVerifier {
            config: config.clone(),
            keys,
        })
    }

    /// The person a JWT stands for, or why it is refused (never quoting the token).
    pub fn verify(&self, token: &str) -> Result<Caller, String> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| format!("the bearer token is not a readable JWT: {e}"))?;
        let keys = self.keys.current();
        let key = match &header.kid {
            Some(kid) => keys.0.iter().find(|k| k.kid.as_deref() == Some(kid.as_str())),
            None if keys.0.len() == 1 => keys.0.first(),
            None => None,
        }
        .ok_or_else(|| {
            format!(
                "the JWT's key ({}) is not in the identity provider's key set; if the provider rotated its keys, update auth.jwt.jwks_file",
                header.kid.as_deref().unwrap_or("no kid")
            )
        })?;
        if header.alg != key.alg {
            return Err(format!(
                "the JWT is signed with {:?} but its key is for {:?}",
                header.alg, key.alg
            ));
        }
        let mut v = Validation::new(key.alg);
        v.set_issuer(&[self.config.issuer.trim()]);
        v.set_audience(&[self.config.audience.trim()]);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        v.validate_nbf = true;
        v.leeway = self.config.leeway_s;
        let claims = jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key.key, &v)
            .map_err(|e| format!("the JWT was refused: {e}"))?
            .claims;
        self.caller(&claims)
    }

    fn caller(&self, claims: &serde_json::Map<String, Value>) -> Result<Caller, String> {
        let c = &self.config;
        let name = claims
            .get(&c.name_claim)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("the JWT has no `{}` (auth.jwt.name_claim)", c.name_claim))?;
        let values = strings(claims.get(&c.role_claim));
        let role = values
            .iter()
            .filter_map(|v| match c.role_map.is_empty() {
                true => v.parse::<Role>().ok(),
                false => c.role_map.get(v).copied(),
            })
            .max()
            .ok_or_else(|| {
                format!(
                    "`{name}` has no cairn role: the JWT's `{}` holds none of {} (auth.jwt.role_claim{})",
                    c.role_claim,
                    match c.role_map.is_empty() {
                        true => "viewer, operator, approver, admin".to_owned(),
                        false => c.role_map.keys().cloned().collect::<Vec<_>>().join(", "),
                    },
                    if c.role_map.is_empty() { "" } else { ", auth.jwt.role_map" }
                )
            })?;
        // Present but empty must not read as "every project" (what no claim means).
        let projects = match claims.get(&c.projects_claim) {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => {
                let p = strings(Some(v));
                if p.is_empty() {
                    return Err(format!(
                        "`{name}` may act on no project: the JWT's `{}` lists none",
                        c.projects_claim
                    ));
                }
                p
            }
        };
        Ok(Caller {
            name: name.to_owned(),
            role,
            projects,
            authenticated: true,
        })
    }
}

/// A claim read as a list of strings (a single string is a list of one).
fn strings(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use base64::Engine;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    const ISSUER: &str = "https://idp.example.test";
    const AUDIENCE: &str = "cairn";

    /// An EC P-256 signing key and its public JWK (kid `kid`).
    fn signing_key(kid: &str) -> (EncodingKey, Value) {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let raw = pair.public_key_raw();
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let jwk = json!({
            "kty": "EC", "crv": "P-256", "alg": "ES256", "kid": kid,
            "x": b64(&raw[1..33]), "y": b64(&raw[33..]),
        });
        let key = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
        (key, jwk)
    }

    fn verifier(dir: &Path, keys: &[&Value]) -> JwtVerifier {
        let path = dir.join(format!("jwks-{}.json", keys.len()));
        std::fs::write(&path, json!({ "keys": keys }).to_string()).unwrap();
        JwtVerifier::new(&JwtConfig {
            jwks_file: path.display().to_string(),
            issuer: ISSUER.into(),
            audience: AUDIENCE.into(),
            ..JwtConfig::default()
        })
        .unwrap()
    }

    fn token(key: &EncodingKey, kid: Option<&str>) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = kid.map(str::to_owned);
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        let claims = json!({
            "iss": ISSUER, "aud": AUDIENCE, "sub": "ann", "cairn_role": "viewer", "exp": exp,
        });
        jsonwebtoken::encode(&header, &claims, key).unwrap()
    }

    #[test]
    fn a_jwt_without_a_kid_is_checked_only_against_a_set_of_one_key() {
        let dir = tempfile::tempdir().unwrap();
        let (a, a_jwk) = signing_key("a");
        let (_, b_jwk) = signing_key("b");
        let one = verifier(dir.path(), &[&a_jwk]);
        assert_eq!(one.verify(&token(&a, None)).unwrap().name, "ann");
        // Among several keys, which one signed a kid-less token is unknown: it is refused,
        // even when the first key of the set would verify it.
        let two = verifier(dir.path(), &[&a_jwk, &b_jwk]);
        let e = two.verify(&token(&a, None)).unwrap_err();
        assert!(e.contains("no kid"), "{e}");
        assert_eq!(two.verify(&token(&a, Some("a"))).unwrap().name, "ann");
        assert!(two.verify(&token(&a, Some("b"))).is_err());
    }

    #[test]
    fn a_keys_algorithm_is_its_alg_or_the_one_its_type_implies_and_never_hmac() {
        let alg = |jwk: Value| algorithm_of(&serde_json::from_value::<Jwk>(jwk).unwrap());
        let rsa = json!({"kty": "RSA", "n": "AQAB", "e": "AQAB"});
        let ec = |crv: &str| json!({"kty": "EC", "crv": crv, "x": "AA", "y": "AA"});
        assert_eq!(alg(rsa.clone()), Ok(Algorithm::RS256));
        let mut ps384 = rsa.clone();
        ps384["alg"] = json!("PS384");
        assert_eq!(alg(ps384), Ok(Algorithm::PS384));
        assert_eq!(alg(ec("P-256")), Ok(Algorithm::ES256));
        assert_eq!(alg(ec("P-384")), Ok(Algorithm::ES384));
        assert!(alg(ec("P-521")).unwrap_err().contains("not supported"));
        let ed = json!({"kty": "OKP", "crv": "Ed25519", "x": "AA"});
        assert_eq!(alg(ed), Ok(Algorithm::EdDSA));
        let oct = json!({"kty": "oct", "k": "c2VjcmV0"});
        assert!(alg(oct).unwrap_err().contains("symmetric"));
        let mut hs = rsa;
        hs["alg"] = json!("HS256");
        assert!(alg(hs).unwrap_err().contains("HMAC"));
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn signed(key: &EncodingKey, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some("a".into());
        jsonwebtoken::encode(&header, claims, key).unwrap()
    }

    #[test]
    fn a_jwt_is_refused_unless_its_issuer_audience_times_and_algorithm_are_right() {
        let dir = tempfile::tempdir().unwrap();
        let (key, jwk) = signing_key("a");
        let v = verifier(dir.path(), &[&jwk]);
        let good = json!({
            "iss": ISSUER, "aud": AUDIENCE, "sub": "ann", "cairn_role": "viewer", "exp": now() + 600,
        });
        assert_eq!(v.verify(&signed(&key, &good)).unwrap().name, "ann");
        let with = |k: &str, val: Value| {
            let mut c = good.clone();
            c[k] = val;
            signed(&key, &c)
        };
        let without = |k: &str| {
            let mut c = good.clone();
            c.as_object_mut().unwrap().remove(k);
            signed(&key, &c)
        };
        for (what, t) in [
            ("another issuer", with("iss", json!("https://evil.test"))),
            ("another audience", with("aud", json!("someone-else"))),
            ("expired past the leeway", with("exp", json!(now() - 120))),
            ("not yet valid", with("nbf", json!(now() + 600))),
            ("no exp", without("exp")),
            ("no iss", without("iss")),
            ("no aud", without("aud")),
        ] {
            let e = v.verify(&t).expect_err(what);
            assert!(e.contains("refused"), "{what}: {e}");
        }
        // Within the leeway (60 s) an expired token still passes.
        assert!(v.verify(&with("exp", json!(now() - 10))).is_ok());
        // Another key's signature under this kid.
        let (other, _) = signing_key("a");
        assert!(v.verify(&signed(&other, &good)).is_err());
        // A token that names another algorithm than its key's.
        let mut header = Header::new(Algorithm::ES384);
        header.kid = Some("a".into());
        let p384 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let k384 = EncodingKey::from_ec_pem(p384.serialize_pem().as_bytes()).unwrap();
        let e = v
            .verify(&jsonwebtoken::encode(&header, &good, &k384).unwrap())
            .unwrap_err();
        assert!(e.contains("ES384") && e.contains("ES256"), "{e}");
        assert!(v
            .verify("a.b.c")
            .unwrap_err()
            .contains("not a readable JWT"));
    }

    fn caller_of(config: JwtConfig, claims: Value) -> Result<Caller, String> {
        let dir = tempfile::tempdir().unwrap();
        let (_, jwk) = signing_key("a");
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, json!({ "keys": [jwk] }).to_string()).unwrap();
        let v = JwtVerifier::new(&JwtConfig {
            jwks_file: path.display().to_string(),
            issuer: ISSUER.into(),
            audience: AUDIENCE.into(),
            ..config
        })
        .unwrap();
        v.caller(claims.as_object().unwrap())
    }

    #[test]
    fn claims_map_to_a_name_the_highest_role_and_the_projects() {
        let plain = JwtConfig::default();
        let c = caller_of(
            plain.clone(),
            json!({"sub": " ann ", "cairn_role": ["viewer", "approver", "nonsense"]}),
        )
        .unwrap();
        assert_eq!((c.name.as_str(), c.role), ("ann", Role::Approver));
        assert!(
            c.projects.is_empty() && c.authenticated,
            "no claim: every project"
        );
        let c = caller_of(
            plain.clone(),
            json!({"sub": "ann", "cairn_role": "operator", "cairn_projects": "web"}),
        )
        .unwrap();
        assert_eq!(
            (c.role, c.projects),
            (Role::Operator, vec!["web".to_owned()])
        );
        let c = caller_of(
            plain.clone(),
            json!({"sub": "ann", "cairn_role": "admin", "cairn_projects": ["web", "api"]}),
        )
        .unwrap();
        assert_eq!(c.projects, vec!["web".to_owned(), "api".to_owned()]);
        let c = caller_of(
            plain.clone(),
            json!({"sub": "ann", "cairn_role": "admin", "cairn_projects": null}),
        )
        .unwrap();
        assert!(c.projects.is_empty());
        // An empty list is no project at all, never every project.
        let e = caller_of(
            plain.clone(),
            json!({"sub": "ann", "cairn_role": "admin", "cairn_projects": []}),
        )
        .unwrap_err();
        assert!(e.contains("no project"), "{e}");
        let e = caller_of(plain.clone(), json!({"sub": "  ", "cairn_role": "admin"})).unwrap_err();
        assert!(e.contains("no `sub`"), "{e}");
        let e = caller_of(
            plain.clone(),
            json!({"sub": "ann", "cairn_role": ["root", 3]}),
        )
        .unwrap_err();
        assert!(
            e.contains("no cairn role") && e.contains("viewer, operator"),
            "{e}"
        );

        // With a role map, the claim's values are names to map; role names are not taken.
        let mapped = JwtConfig {
            name_claim: "email".into(),
            role_claim: "groups".into(),
            role_map: BTreeMap::from([
                ("devs".to_owned(), Role::Operator),
                ("leads".to_owned(), Role::Approver),
            ]),
            ..JwtConfig::default()
        };
        let c = caller_of(
            mapped.clone(),
            json!({"email": "b@x.test", "groups": ["devs", "leads", "admin"]}),
        )
        .unwrap();
        assert_eq!((c.name.as_str(), c.role), ("b@x.test", Role::Approver));
        let e = caller_of(mapped, json!({"email": "b@x.test", "groups": ["admin"]})).unwrap_err();
        assert!(e.contains("devs, leads") && e.contains("role_map"), "{e}");
    }

    #[test]
    fn settings_are_checked_and_a_key_set_must_hold_usable_keys() {
        let dir = tempfile::tempdir().unwrap();
        let (_, jwk) = signing_key("a");
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, json!({ "keys": [jwk] }).to_string()).unwrap();
        let base = JwtConfig {
            jwks_file: path.display().to_string(),
            issuer: ISSUER.into(),
            audience: AUDIENCE.into(),
            ..JwtConfig::default()
        };
        assert!(base.is_on() && !JwtConfig::default().is_on());
        for key in ["issuer", "audience", "name_claim", "role_claim"] {
            let mut c = base.clone();
            match key {
                "issuer" => c.issuer = " ".into(),
                "audience" => c.audience = String::new(),
                "name_claim" => c.name_claim = String::new(),
                _ => c.role_claim = String::new(),
            }
            let e = JwtVerifier::new(&c).err().unwrap();
            assert!(e.contains(&format!("auth.jwt.{key}")), "{e}");
        }
        for (body, says) in [
            (json!({"keys": []}).to_string(), "holds no keys"),
            ("not json".to_owned(), "is not a JWKS"),
            (
                json!({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "s"}]}).to_string(),
                "key s",
            ),
        ] {
            std::fs::write(&path, body).unwrap();
            let e = JwtVerifier::new(&base).err().unwrap();
            assert!(e.contains(says) && e.contains("jwks.json"), "{e}");
        }
        assert!(
            looks_like_jwt("a.b.c") && !looks_like_jwt("cairn_abc") && !looks_like_jwt("a.b.c.d")
        );
    }
}
