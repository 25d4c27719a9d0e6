//! Images a request may name (allowed_images), the toolchain image, and the network policy:
//! a run in the toolchain image installs a package from a local index served by the test on a
//! Docker network the test creates (docker_network), only with network on; images and network
//! the runner does not allow are refused with their reason words, on every backend.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/index.rs"]
mod index;

use cairn_proto as pb;
use common::*;
use index::{toolchain_image as toolchain, PackageIndex, TestNetwork, VALUE};

/// Docker with both images; with CAIRN_REQUIRE_DOCKER=1 a missing one fails the test.
async fn toolchain_ready(test: &str) -> bool {
    if !docker_only(test).await {
        return false;
    }
    match (index::toolchain_image_present(), docker_required()) {
        (true, _) => true,
        (false, true) => panic!(
            "CAIRN_REQUIRE_DOCKER=1 but the image {} is missing: build it with deploy/images/build-images.sh",
            toolchain()
        ),
        (false, false) => {
            println!(
                "SKIP: {test} [docker]: image {} missing; build it with deploy/images/build-images.sh",
                toolchain()
            );
            false
        }
    }
}

fn reason(s: &tonic::Status) -> String {
    s.metadata()
        .get("cairn-reason")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

fn allow_toolchain(c: &mut cairn_sandbox_runner::Config) {
    c.allowed_images = vec![toolchain()];
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pip_installs_from_a_local_index_only_with_network() {
    let test = "pip_installs_from_a_local_index_only_with_network";
    if !toolchain_ready(test).await {
        return;
    }
    let net = TestNetwork::create("pip");
    let index = PackageIndex::serve(&net.gateway).await;
    let network = net.name.clone();
    let r = TestRunner::start_with(
        Case {
            backend: cairn_sandbox_runner::BackendChoice::Docker,
            pool: false,
        },
        move |c| {
            allow_toolchain(c);
            c.network_allowed = true;
            c.docker_network = network;
        },
    )
    .await;
    let install = |network: bool| {
        let mut req = with_timeout(bash(&index.pip_install_script("/tmp/venv")), 180_000);
        req.image = toolchain();
        req.network = network;
        req
    };

    // Network off: the venv is made, the index is out of reach.
    let off = r.run(install(false)).await;
    assert_ne!(off.exit_code, 0, "{}", text(&off.stdout));
    assert!(!text(&off.stdout).contains(VALUE));
    assert!(index.requests().is_empty(), "{:?}", index.requests());

    // Network on: pip fetches the page and the wheel from the test's index.
    let on = r.run(install(true)).await;
    assert_eq!(
        on.exit_code,
        0,
        "stdout: {}\nstderr: {}",
        text(&on.stdout),
        text(&on.stderr)
    );
    assert!(text(&on.stdout).ends_with(&format!("{VALUE}\n")), "{on:?}");
    let asked = index.requests();
    assert!(
        asked.iter().any(|p| p.ends_with(".whl")),
        "the wheel was not fetched: {asked:?}"
    );
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_in_the_toolchain_image_builds_code() {
    let test = "a_session_in_the_toolchain_image_builds_code";
    if !toolchain_ready(test).await {
        return;
    }
    let r = TestRunner::start_with(
        Case {
            backend: cairn_sandbox_runner::BackendChoice::Docker,
            pool: false,
        },
        allow_toolchain,
    )
    .await;
    let mut c = r.client.clone();
    let info = c
        .open_session(pb::OpenSessionRequest {
            session_id: "tc-session".into(),
            image: toolchain(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.image, toolchain());
    assert_eq!(info.container_name, "cairn_tc-session_runner");
    let script = "set -e; printf 'int main(void){return 7;}\\n' > a.c; \
                  printf 'a: a.c\\n\\tgcc -o a a.c\\n' > Makefile; make -s; ./a || echo built:$?; \
                  node -e 'console.log(6*7)'; npm --version >/dev/null; \
                  python3 -m venv /tmpfs/v && /tmpfs/v/bin/pip --version >/dev/null; \
                  git --version >/dev/null; curl --version >/dev/null; echo ok";
    let out = c
        .exec(pb::ExecRequest {
            session_id: "tc-session".into(),
            command: script.into(),
            timeout_ms: 120_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (out.exit_code, text(&out.stdout)),
        (0, "built:7\n42\nok\n".to_owned()),
        "stderr: {}",
        text(&out.stderr)
    );
    // The default sandbox image has none of these.
    c.open_session(pb::OpenSessionRequest {
        session_id: "plain-session".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let out = c
        .exec(pb::ExecRequest {
            session_id: "plain-session".into(),
            command: "command -v gcc || command -v npm || echo none".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(text(&out.stdout), "none\n");
    r.stop().await;
}

/// Refusals come before any sandbox is made, so every backend this host has answers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn images_and_network_the_runner_does_not_allow_are_refused() {
    for case in cold_backends("images_and_network_the_runner_does_not_allow_are_refused").await {
        let r = TestRunner::start(case).await;
        let mut c = r.client.clone();

        let mut req = python("print(1)");
        req.image = "debian:bookworm".into();
        let e = c.run(req).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{case:?}: {e:?}");
        assert_eq!(reason(&e), "image_not_allowed");
        assert!(e.message().contains("allowed_images"), "{e:?}");
        let e = c
            .open_session(pb::OpenSessionRequest {
                image: "debian:bookworm".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(reason(&e), "image_not_allowed", "{e:?}");

        let mut req = python("print(1)");
        req.network = true;
        let e = c.run(req).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{case:?}: {e:?}");
        assert_eq!(reason(&e), "network_not_allowed");
        assert!(e.message().contains("network_allowed"), "{e:?}");
        let e = c
            .open_session(pb::OpenSessionRequest {
                network: true,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(reason(&e), "network_not_allowed", "{e:?}");

        // The runner's own image is always fine; the info says what is allowed.
        let mut req = python("print(1)");
        req.image = image();
        assert_eq!(text(&c.run(req).await.unwrap().into_inner().stdout), "1\n");
        let info = c
            .get_runner_info(pb::GetRunnerInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(!info.network_allowed);
        assert_eq!(info.image, image());
        assert!(info.allowed_images.contains(&toolchain()), "{info:?}");

        // The local backend has no images: an allowed one is refused there, not ignored.
        if !case.docker() {
            let mut req = python("print(1)");
            req.image = toolchain();
            let e = c.run(req).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
            assert_eq!(reason(&e), "image_needs_docker");
        }
        r.stop().await;
    }
}

/// An allowed image the engine does not have says how to build it (nothing is pulled).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_allowed_image_that_is_missing_is_named() {
    if !docker_only("an_allowed_image_that_is_missing_is_named").await {
        return;
    }
    let r = TestRunner::start_with(
        Case {
            backend: cairn_sandbox_runner::BackendChoice::Docker,
            pool: false,
        },
        |c| c.allowed_images = vec!["cairn-no-such-image:never".into()],
    )
    .await;
    let mut req = python("print(1)");
    req.image = "cairn-no-such-image:never".into();
    let e = r.client.clone().run(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert_eq!(reason(&e), "image_missing");
    assert!(e.message().contains("build-images.sh"), "{e:?}");
    r.stop().await;
}
