//! Compiles every `.proto` under `proto/` with the vendored protoc, so the build needs nothing
//! installed and a new package needs no change here.
//!
//! All files go through one protoc run; tonic's include file nests the generated packages as
//! modules by package name (`kas.tunnel.v1` -> `pb::kas::tunnel::v1`), so the relative paths
//! prost generates between packages (`super::tunnel::v1::Header` from `kas.v1`) resolve as they
//! are. `src/lib.rs` includes that one file.

use std::path::{Path, PathBuf};

/// The `.proto` files under `dir`, sorted (a stable order keeps the generated code stable).
fn proto_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            proto_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let include = protoc_bin_vendored::include_path()?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    println!("cargo:rerun-if-changed=proto");
    let mut files = Vec::new();
    proto_files(Path::new("proto"), &mut files)?;
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(&protoc);
    config.bytes(["."]);
    // The tunnel's metadata: a handful of short keys per message, for which a B-tree's
    // comparisons cost less than hashing every key with SipHash (issue 14).
    config.btree_map([".kas.tunnel.v1"]);
    // The proxied heads are written by hand, with their headers as an `http::HeaderMap`
    // (`src/http/head.rs`); the generated `HttpFrame` holds those.
    for head in ["HttpRequestHead", "HttpResponseHead"] {
        config.extern_path(format!(".kas.kubernetes_api.v1.{head}"), format!("crate::http::{head}"));
    }
    // `AgentTunnel.Connect` would clash with the generated `Client::connect(dst)`; clients are
    // built with `::new(channel)` instead, so transport constructors are not generated.
    tonic_prost_build::configure()
        .build_transport(false)
        // `flow::Codec`: prost with small initial buffers (memory per tunnel, issue 12).
        .codec_path("crate::flow::Codec")
        .out_dir(&out_dir)
        .include_file("packages.rs")
        .compile_with_config(config, &files, &[PathBuf::from("proto"), include])?;
    Ok(())
}
