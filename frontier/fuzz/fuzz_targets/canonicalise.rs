//! URLs arrive from any client and any page: canonicalisation must never
//! panic, must respect the length limit, must be idempotent, and its
//! shortcut for URLs already canonical must answer as parsing does.

#![no_main]

use frontier::canonical::{canonicalise, canonicalise_by_parsing};
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 2048;

fuzz_target!(|input: &str| {
    assert_eq!(canonicalise(input, LIMIT), canonicalise_by_parsing(input, LIMIT));
    if let Ok(canonical) = canonicalise(input, LIMIT) {
        assert!(canonical.as_str().len() <= LIMIT);
        let again = canonicalise(canonical.as_str(), LIMIT).expect("a canonical URL is valid");
        assert_eq!(again.as_str(), canonical.as_str());
        assert_eq!(again.host(), canonical.host());
    }
});
