//! URLs arrive from any client and any page: canonicalisation must never
//! panic, must respect the length limit, and must be idempotent.

#![no_main]

use frontier::canonical::canonicalise;
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 2048;

fuzz_target!(|input: &str| {
    if let Ok(canonical) = canonicalise(input, LIMIT) {
        assert!(canonical.as_str().len() <= LIMIT);
        let again = canonicalise(canonical.as_str(), LIMIT).expect("a canonical URL is valid");
        assert_eq!(again.as_str(), canonical.as_str());
        assert_eq!(again.host(), canonical.host());
    }
});
