//! Generic building blocks with no knowledge of kas's features: several parts of kas use each
//! of them, so they live here rather than under one of those parts.

pub mod private_file;
pub mod tls;
pub mod token_bucket;
pub mod ttl_cache;
