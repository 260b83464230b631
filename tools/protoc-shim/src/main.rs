//! The part of protoc's command line prost-build uses: `--include_imports`,
//! `--include_source_info`, `-o FILE`, `-I DIR` (or `--proto_path`), and
//! the files to compile. Other flags (`--version` too: this is not protoc)
//! are refused by name, so a build that needs more fails saying so instead
//! of producing something else.

use std::path::PathBuf;
use std::process::ExitCode;

use prost::Message;

#[derive(Default)]
struct Invocation {
    include_imports: bool,
    include_source_info: bool,
    output: Option<PathBuf>,
    includes: Vec<PathBuf>,
    files: Vec<PathBuf>,
}

fn parse(args: impl IntoIterator<Item = String>) -> Result<Invocation, String> {
    let mut invocation = Invocation::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value_of = |flag: &str| {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value"))
                .map(PathBuf::from)
        };
        match arg.as_str() {
            "--include_imports" => invocation.include_imports = true,
            "--include_source_info" => invocation.include_source_info = true,
            // protox accepts proto3 optional fields without being asked.
            "--experimental_allow_proto3_optional" => {}
            "-o" => invocation.output = Some(value_of("-o")?),
            "-I" | "--proto_path" => invocation.includes.push(value_of(&arg)?),
            _ => {
                if let Some(path) = arg.strip_prefix("--descriptor_set_out=") {
                    invocation.output = Some(path.into());
                } else if let Some(path) = arg.strip_prefix("--proto_path=") {
                    invocation.includes.push(path.into());
                } else if let Some(path) = arg.strip_prefix("-I").filter(|p| !p.is_empty()) {
                    invocation.includes.push(path.into());
                } else if arg.starts_with('-') {
                    return Err(format!("unsupported protoc option {arg}"));
                } else {
                    invocation.files.push(arg.into());
                }
            }
        }
    }
    Ok(invocation)
}

fn run(invocation: Invocation) -> Result<(), String> {
    let output = invocation
        .output
        .ok_or("no -o FILE given: this protoc only writes descriptor sets")?;
    let mut compiler = protox::Compiler::new(&invocation.includes).map_err(|e| e.to_string())?;
    compiler
        .include_imports(invocation.include_imports)
        .include_source_info(invocation.include_source_info);
    compiler
        .open_files(&invocation.files)
        .map_err(|e| format!("{e:?}"))?;
    let set = compiler.file_descriptor_set();
    std::fs::write(&output, set.encode_to_vec())
        .map_err(|e| format!("cannot write {}: {e}", output.display()))
}

fn main() -> ExitCode {
    match parse(std::env::args().skip(1)).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("protoc (protox shim): {message}");
            ExitCode::FAILURE
        }
    }
}
