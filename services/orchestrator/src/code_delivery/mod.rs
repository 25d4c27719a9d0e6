//! The code delivery agent (seed 003). So far its `[code_delivery]` config section; the tool
//! loop joins here.

pub mod config;

pub use config::{ArchiveFormat, CodeDeliveryConfig};
