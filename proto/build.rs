//! Compiles the .proto files with protox, a pure-Rust protobuf compiler, so
//! that building needs no `protoc` on the machine.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(
        ["urlfrontier.proto", "frontier/admin/v1/admin.proto"],
        ["proto"],
    )?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    // Served by gRPC reflection, so grpcurl works without our .proto files.
    std::fs::write(out_dir.join("descriptors.bin"), descriptors.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::Codec")
        // Maps (a URL's metadata, a few keys) as BTreeMaps: no hasher
        // to seed and run for every message.
        .btree_map(".")
        .compile_fds(descriptors)?;
    Ok(())
}
