//! A `url_records` value is read back from disk, which can be damaged:
//! decoding its entries must fail with a typed error or give entries that
//! encode back, each in the form it was read in, to exactly the input,
//! never panic or allocate what a corrupt length claims.

#![no_main]

use frontier::record::StoredEntry;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(entries) = StoredEntry::decode_all(bytes) {
        let mut again = Vec::with_capacity(bytes.len());
        for entry in &entries {
            let record = entry
                .record("q".to_owned())
                .expect("an entry that decodes has readable metadata");
            // The URL reads whole with any queue key.
            assert!(entry.is_url(&entry.url("q"), "q"));
            entry.encode_again(&record, &mut again);
        }
        assert_eq!(again, bytes);
    }
});
