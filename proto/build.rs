//! Compiles the .proto files with the vendored protoc, so the build needs nothing installed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let include = protoc_bin_vendored::include_path()?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let includes = [PathBuf::from("proto"), include];
    let base = [PathBuf::from("proto/kas/v1/kas.proto"), PathBuf::from("proto/kas/tunnel/v1/tunnel.proto")];
    // Feature packages refer to `kas.v1` messages; they are compiled in a second pass so those
    // references resolve to `crate::kas` instead of relative `super::` paths.
    let features = [PathBuf::from("proto/kas/get_pods/v1/get_pods.proto")];
    for f in base.iter().chain(&features) {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let config = || {
        let mut c = tonic_prost_build::Config::new();
        c.protoc_executable(&protoc);
        c.bytes(["."]);
        c
    };
    // `AgentTunnel.Connect` would clash with the generated `Client::connect(dst)`; clients are
    // built with `::new(channel)` instead, so transport constructors are not generated.
    tonic_prost_build::configure()
        .build_transport(false)
        .file_descriptor_set_path(out_dir.join("kas_descriptor.bin"))
        .compile_with_config(config(), &base, &includes)?;
    // Its own directory: the pass also emits `kas.v1.rs`, which must not replace the first one.
    let features_out = out_dir.join("features");
    std::fs::create_dir_all(&features_out)?;
    tonic_prost_build::configure()
        .build_transport(false)
        .out_dir(&features_out)
        .extern_path(".kas.v1", "crate::kas")
        .compile_with_config(config(), &features, &includes)?;
    Ok(())
}
