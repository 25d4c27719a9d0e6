//! Compiles `proto/cairn/v1/*.proto` with protox (pure Rust; no protoc needed) and writes the
//! encoded descriptor set for gRPC reflection.
use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "cairn/v1/common.proto",
    "cairn/v1/artifact_store.proto",
    "cairn/v1/ingest.proto",
    "cairn/v1/sandbox.proto",
    "cairn/v1/orchestrator.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The manifest dir as cargo sets it for this run, not as baked in when the script was
    // compiled: checkouts sharing a target directory share the compiled script.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    for p in PROTOS {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    // Checkouts at other paths share this build's fingerprint when they share a target
    // directory, and the paths above are absolute: a change of checkout (its path, set by
    // .cargo/config.toml) must run this script again, or one checkout would compile the
    // other's protos.
    println!("cargo:rerun-if-env-changed=CAIRN_CHECKOUT");
    let mut compiler = protox::Compiler::new([&root])?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_files(PROTOS.iter().copied())?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("cairn_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .bytes(".")
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
