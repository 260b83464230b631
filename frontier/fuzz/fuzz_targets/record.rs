//! URL records are read back from disk, which can be damaged: decoding must
//! fail with a typed error or give a record that encodes back, in the
//! version it was read in, to exactly the input, never panic or allocate
//! what a corrupt length claims.

#![no_main]

use frontier::record::UrlRecord;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(record) = UrlRecord::decode(bytes) {
        assert_eq!(record.encode_as_read(bytes), bytes);
    }
});
