//! The generated code for cairn's gRPC contracts. The `.proto` files in `proto/cairn/v1/` are
//! the only contract between services; this crate only compiles them.

#[allow(clippy::all, clippy::unwrap_used, rust_2018_idioms)]
pub mod v1 {
    tonic::include_proto!("cairn.v1");
}

/// Encoded `FileDescriptorSet` of every cairn proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/cairn_descriptor.bin"));

pub use v1::*;

/// The `cairn-reason` trailing metadata: one word of the reason vocabulary (common.proto) on
/// every refusal, so clients can act on the reason without parsing messages.
pub mod reason {
    use tonic::{metadata::MetadataValue, Code, Status};

    /// Metadata key carrying the reason word.
    pub const METADATA_KEY: &str = "cairn-reason";

    /// A status with `message` and the reason word in its metadata.
    pub fn status(code: Code, message: impl Into<String>, reason: &str) -> Status {
        let mut status = Status::new(code, message);
        if let Ok(value) = MetadataValue::try_from(reason) {
            status.metadata_mut().insert(METADATA_KEY, value);
        }
        status
    }

    /// The reason word of a status, if it carries one.
    pub fn of(status: &Status) -> Option<String> {
        status
            .metadata()
            .get(METADATA_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}
