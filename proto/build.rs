//! Compiles the .proto files with the vendored protoc, so the build needs nothing installed.
//!
//! Packages are compiled in passes, each into its own directory, so a package refers to the
//! packages of earlier passes by crate path (`extern_path`) instead of relative `super::` paths
//! that would not match this crate's module layout.

use std::path::PathBuf;

/// One compile pass: package files, out subdirectory, proto package -> Rust path of earlier passes.
type Pass = (&'static [&'static str], &'static str, &'static [(&'static str, &'static str)]);

const PASSES: &[Pass] = &[
    (
        &["kas/tunnel/v1/tunnel.proto", "kas/registry/v1/registry.proto", "kas/kubernetes_api/v1/kubernetes_api.proto"],
        "base",
        &[],
    ),
    (
        &["kas/v1/kas.proto"],
        "api",
        &[(".kas.tunnel.v1", "crate::tunnel::pb"), (".kas.kubernetes_api.v1", "crate::kubernetes_api")],
    ),
    (
        &["kas/get_pods/v1/get_pods.proto"],
        "features",
        &[(".kas.tunnel.v1", "crate::tunnel::pb"), (".kas.v1", "crate::kas")],
    ),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let include = protoc_bin_vendored::include_path()?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let includes = [PathBuf::from("proto"), include];
    println!("cargo:rerun-if-changed=proto");
    for (files, subdir, externs) in PASSES {
        let out = out_dir.join(subdir);
        std::fs::create_dir_all(&out)?;
        let mut config = tonic_prost_build::Config::new();
        config.protoc_executable(&protoc);
        config.bytes(["."]);
        // `AgentTunnel.Connect` would clash with the generated `Client::connect(dst)`; clients
        // are built with `::new(channel)` instead, so transport constructors are not generated.
        // `flow::Codec`: prost with small initial buffers (memory per tunnel, issue 12).
        let mut builder =
            tonic_prost_build::configure().build_transport(false).codec_path("crate::flow::Codec").out_dir(&out);
        for (package, path) in *externs {
            builder = builder.extern_path(*package, *path);
        }
        let files: Vec<PathBuf> = files.iter().map(|f| PathBuf::from("proto").join(f)).collect();
        builder.compile_with_config(config, &files, &includes)?;
    }
    Ok(())
}
