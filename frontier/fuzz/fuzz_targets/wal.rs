//! Write-ahead logs are read back after crashes and damage: reading any
//! bytes must give the records it finds or a typed error, never panic or
//! allocate what a corrupt length claims; every record it gives decodes
//! and encodes back to the payload it was read from.

#![no_main]

use frontier::wal::{decode_ops, encode_ops, inspect_bytes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u64, &[u8])| {
    let (durable, bytes) = input;
    if let Ok(inspection) = inspect_bytes(std::path::Path::new("fuzz.wal"), bytes, durable) {
        let scan = &inspection.scan;
        for record in scan.records.iter().chain(scan.later.iter().map(|(_, r)| r)) {
            let payload = encode_ops(&record.ops);
            assert_eq!(decode_ops(&payload).as_ref(), Ok(&record.ops));
        }
        for pair in scan.records.windows(2) {
            assert_eq!(pair[0].lsn + 1, pair[1].lsn);
        }
    }
});
