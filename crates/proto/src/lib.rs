//! The generated code for cairn's gRPC contracts. The `.proto` files in `proto/cairn/v1/` are
//! the only contract between services; this crate only compiles them.

#![allow(clippy::all, missing_docs, rust_2018_idioms)]

pub mod v1 {
    tonic::include_proto!("cairn.v1");
}

/// Encoded `FileDescriptorSet` of every cairn proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cairn_descriptor.bin"));

pub use v1::*;
