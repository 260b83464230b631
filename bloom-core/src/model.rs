//! The mathematics: sizing from (n, p) and the false-positive models the
//! tests hold each layout to.
//!
//! Standard layout: each key sets k bits chosen uniformly over m, so after n
//! keys a bit is set with probability `1 - (1 - 1/m)^(kn) ≈ 1 - e^(-kn/m)` and
//! a false positive needs k set bits: `(1 - e^(-kn/m))^k`.
//!
//! Blocked layout: a key picks one 512-bit block uniformly, then k bit
//! positions in it, independent and uniform (so two of them may coincide).
//! With B blocks the number of keys j in a block is Poisson with mean n/B. A
//! block holding j keys has S set bits, distributed as the number of occupied
//! bins after jk balls are thrown into 512 bins. A query lands in a block and
//! needs its k positions set, each with probability S/512 given S:
//!
//! ```text
//! FP = Σ_j Pois(j; n/B) · E[(S_j / 512)^k]
//! ```
//!
//! [`blocked_fp_rate`] evaluates this exactly (the occupancy distribution by
//! dynamic programming); [`blocked_fp_rate_approx`] replaces `E[(S/512)^k]`
//! by `(E[S]/512)^k`, which is within about 2% and cheap enough for sizing.

use std::f64::consts::LN_2;

/// Bits in one block of the blocked layout: one 64-byte cache line.
pub const BLOCK_BITS: u64 = 512;

/// The most hash functions a filter may use. k beyond this only arises for
/// false-positive targets far below 1e-15.
pub const MAX_HASHES: u32 = 64;

/// Bits for n keys at false-positive rate p in the standard layout:
/// `m = -n ln p / (ln 2)^2`.
#[must_use]
pub fn optimal_bits(expected_items: u64, fp_rate: f64) -> f64 {
    -(expected_items as f64) * fp_rate.ln() / (LN_2 * LN_2)
}

/// Hash count for m bits and n keys: `round((m/n) ln 2)`, at least 1.
#[must_use]
pub fn optimal_hashes(bits: u64, expected_items: u64) -> u32 {
    let k = (bits as f64 / expected_items.max(1) as f64 * LN_2).round();
    (k as u32).clamp(1, MAX_HASHES)
}

/// The standard layout's false-positive rate after n distinct keys.
#[must_use]
pub fn standard_fp_rate(bits: u64, hashes: u32, items: u64) -> f64 {
    let fill = -(-(hashes as f64) * items as f64 / bits as f64).exp_m1();
    fill.powi(hashes as i32)
}

/// The blocked layout's false-positive rate after n distinct keys, exactly
/// as the model in this module's docs states it.
#[must_use]
pub fn blocked_fp_rate(bits: u64, hashes: u32, items: u64) -> f64 {
    let blocks = (bits / BLOCK_BITS).max(1);
    let lambda = items as f64 / blocks as f64;
    poisson_occupancy_sum(lambda, BLOCK_BITS as usize, hashes, |fp| fp)
}

/// [`blocked_fp_rate`] with `E[(S/512)^k]` replaced by `(E[S]/512)^k`.
#[must_use]
pub fn blocked_fp_rate_approx(bits: u64, hashes: u32, items: u64) -> f64 {
    let blocks = (bits / BLOCK_BITS).max(1);
    let lambda = items as f64 / blocks as f64;
    let miss_one = (1.0 - 1.0 / BLOCK_BITS as f64).ln();
    let mut poisson = (-lambda).exp();
    let mut total = 0.0;
    for keys in 0..=poisson_upper(lambda) {
        if keys > 0 {
            poisson *= lambda / keys as f64;
        }
        let fill = -(miss_one * (keys * u64::from(hashes)) as f64).exp_m1();
        total += poisson * fill.powi(hashes as i32);
    }
    total
}

/// A blocked-layout size (a whole number of blocks, within about 1% of the
/// smallest) and its best hash count that meet `fp_rate` for
/// `expected_items` keys under the exact model.
#[must_use]
pub fn blocked_size(expected_items: u64, fp_rate: f64) -> (u64, u32) {
    let n = expected_items.max(1);
    let standard = optimal_bits(n, fp_rate).max(BLOCK_BITS as f64);
    let best_k_for = |bits: u64| -> (u32, f64) {
        let center = optimal_hashes(bits, n);
        let low = center.saturating_sub(3).max(1);
        let high = (center + 3).min(MAX_HASHES);
        (low..=high)
            .map(|k| (k, blocked_fp_rate_approx(bits, k, n)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((center, 1.0))
    };
    let blocks_for = |bits: f64| (bits / BLOCK_BITS as f64).ceil().max(1.0) as u64;
    // The blocked layout needs somewhat more bits than the standard one for
    // the same rate; grow by 1% steps from the standard size, then refine by
    // bisection between the last miss and the first hit.
    let mut low = blocks_for(standard);
    if best_k_for(low * BLOCK_BITS).1 <= fp_rate {
        return (low * BLOCK_BITS, best_k_for(low * BLOCK_BITS).0);
    }
    let mut high = low;
    loop {
        high = blocks_for(high as f64 * BLOCK_BITS as f64 * 1.1) + 1;
        if best_k_for(high * BLOCK_BITS).1 <= fp_rate {
            break;
        }
        low = high;
    }
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if best_k_for(mid * BLOCK_BITS).1 <= fp_rate {
            high = mid;
        } else {
            low = mid;
        }
    }
    // The approximation is a few percent optimistic; settle the size with
    // the exact model, growing by 1% steps (each step costs about a
    // millisecond).
    let mut bits = high * BLOCK_BITS;
    let mut hashes = best_k_for(bits).0;
    while blocked_fp_rate(bits, hashes, n) > fp_rate {
        bits = blocks_for(bits as f64 * 1.01) * BLOCK_BITS;
        hashes = best_k_for(bits).0;
    }
    (bits, hashes)
}

/// Bits in one word of a split block: the split-block layout sets `k / 8`
/// bits in each of the block's eight words.
pub const SPLIT_WORD_BITS: u64 = 64;

/// Words per split block.
pub const SPLIT_WORDS: u32 = 8;

/// False-positive rate of the split-block layout after `items` keys.
///
/// Keys per block are Poisson(λ = items / blocks). Given j keys in a block,
/// each word has received `j k/8` independent uniform bits, so the number of
/// ones in one word follows the occupancy distribution of that many throws
/// into 64 bins (computed exactly), the words are independent, and a query
/// (k/8 uniform bits in each word) is a false positive with probability
/// `E[(ones/64)^(k/8)]^8`. No approximation beyond the hash's uniformity.
#[must_use]
pub fn split_block_fp_rate(bits: u64, hashes: u32, items: u64) -> f64 {
    split_fp_rate(BLOCK_BITS, SPLIT_WORD_BITS, bits, hashes, items)
}

/// Bits in one word of a [`Layout::SplitBlock256`](crate::Layout) bucket.
pub const SPLIT_256_WORD_BITS: u64 = 32;

/// Bits in one [`Layout::SplitBlock256`](crate::Layout) bucket.
pub const SPLIT_256_BUCKET_BITS: u64 = 256;

/// False-positive rate of the 256-bit split-block layout after `items`
/// keys: the model of [`split_block_fp_rate`] over 256-bit buckets of
/// eight 32-bit words.
#[must_use]
pub fn split_block_256_fp_rate(bits: u64, hashes: u32, items: u64) -> f64 {
    split_fp_rate(
        SPLIT_256_BUCKET_BITS,
        SPLIT_256_WORD_BITS,
        bits,
        hashes,
        items,
    )
}

fn split_fp_rate(bucket_bits: u64, word_bits: u64, bits: u64, hashes: u32, items: u64) -> f64 {
    let buckets = (bits / bucket_bits).max(1);
    let lambda = items as f64 / buckets as f64;
    let per_word = (hashes / SPLIT_WORDS).max(1);
    poisson_occupancy_sum(lambda, word_bits as usize, per_word, |word_fp| {
        word_fp.powi(SPLIT_WORDS as i32)
    })
}

/// The sum both block models are: over j ~ Poisson(λ) keys in a block,
/// `per_block(E[(S/bins)^draws])`, where S is the number of occupied bins
/// after `j * draws` uniform throws into `bins` bins (the occupancy
/// distribution, computed exactly step by step) and a query tests `draws`
/// uniform bins.
fn poisson_occupancy_sum(
    lambda: f64,
    bins: usize,
    draws: u32,
    per_block: impl Fn(f64) -> f64,
) -> f64 {
    let mut occupancy = vec![0.0_f64; bins + 1];
    occupancy[0] = 1.0;
    let mut next = vec![0.0_f64; bins + 1];
    let mut poisson = (-lambda).exp();
    let mut total = 0.0;
    for keys in 0..=poisson_upper(lambda) {
        if keys > 0 {
            poisson *= lambda / keys as f64;
            for _ in 0..draws {
                next.iter_mut().for_each(|p| *p = 0.0);
                for (occupied, &p) in occupancy.iter().enumerate() {
                    if p == 0.0 {
                        continue;
                    }
                    let hit = occupied as f64 / bins as f64;
                    next[occupied] += p * hit;
                    if occupied < bins {
                        next[occupied + 1] += p * (1.0 - hit);
                    }
                }
                std::mem::swap(&mut occupancy, &mut next);
            }
        }
        let query_fp: f64 = occupancy
            .iter()
            .enumerate()
            .map(|(occupied, &p)| p * (occupied as f64 / bins as f64).powi(draws as i32))
            .sum();
        total += poisson * per_block(query_fp);
    }
    total
}

/// The smallest split-block filter (bits, k) whose model meets `fp_rate` for
/// `expected_items` keys: for each k in 8, 16, ..., 64 the fewest blocks
/// that meet the rate (the rate falls as blocks grow), then the k needing
/// the fewest bits (the smaller k on a tie, for cheaper probes). `None`
/// when no filter up to `max_bits` meets the rate.
#[must_use]
pub fn split_block_size(expected_items: u64, fp_rate: f64, max_bits: u64) -> Option<(u64, u32)> {
    split_size(expected_items, fp_rate, max_bits, split_block_fp_rate)
}

/// [`split_block_size`] for the 256-bit split-block layout (its arrays,
/// too, are whole 512-bit lines).
#[must_use]
pub fn split_block_256_size(
    expected_items: u64,
    fp_rate: f64,
    max_bits: u64,
) -> Option<(u64, u32)> {
    split_size(expected_items, fp_rate, max_bits, split_block_256_fp_rate)
}

fn split_size(
    expected_items: u64,
    fp_rate: f64,
    max_bits: u64,
    model: fn(u64, u32, u64) -> f64,
) -> Option<(u64, u32)> {
    let n = expected_items.max(1);
    let max_blocks = max_bits / BLOCK_BITS;
    let meets = |blocks: u64, hashes: u32| model(blocks * BLOCK_BITS, hashes, n) <= fp_rate;
    let mut best: Option<(u64, u32)> = None;
    'hash_counts: for hashes in (SPLIT_WORDS..=MAX_HASHES).step_by(SPLIT_WORDS as usize) {
        // The textbook size is a lower bound no blocked filter beats.
        let mut low = ((optimal_bits(n, fp_rate) / BLOCK_BITS as f64).floor() as u64)
            .clamp(1, max_blocks.max(1));
        // Double until the rate is met; then `high` meets it and `low`
        // either does not or is `high`.
        let mut high = low;
        while !meets(high, hashes) {
            if high >= max_blocks {
                continue 'hash_counts;
            }
            low = high;
            high = high.saturating_mul(2).min(max_blocks);
        }
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if meets(mid, hashes) {
                high = mid;
            } else {
                low = mid;
            }
        }
        if best.is_none_or(|(bits, _)| high * BLOCK_BITS < bits) {
            best = Some((high * BLOCK_BITS, hashes));
        }
    }
    best
}

/// Number of distinct keys that explains `ones` set bits out of `bits` with
/// k bits per key: the inverse of `E[ones] = m (1 - (1 - 1/m)^(kn))`.
#[must_use]
pub fn items_from_ones(bits: u64, hashes: u32, ones: u64) -> f64 {
    if ones == 0 {
        return 0.0;
    }
    // A full bit array explains any number of keys; report the count at
    // which one bit would be left unset, the largest finite estimate.
    let ones = ones.min(bits.saturating_sub(1)).max(1) as f64;
    let m = bits as f64;
    (-ones / m).ln_1p() / (f64::from(hashes) * (-1.0 / m).ln_1p())
}

/// A bound beyond which Poisson(lambda) has negligible mass (< 1e-15).
fn poisson_upper(lambda: f64) -> u64 {
    (lambda + 12.0 * lambda.sqrt() + 30.0).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizing_matches_the_textbook() {
        // n = 1e6, p = 0.01: m = 9.585 bits per key, k = 7.
        let bits = optimal_bits(1_000_000, 0.01);
        assert!((bits / 1e6 - 9.585).abs() < 0.01, "{bits}");
        assert_eq!(optimal_hashes(bits as u64, 1_000_000), 7);
        let fp = standard_fp_rate(bits as u64, 7, 1_000_000);
        assert!((fp - 0.01).abs() < 0.0005, "{fp}");
    }

    #[test]
    fn blocked_models_agree() {
        for (bits_per_key, k) in [(10_u64, 7_u32), (20, 13), (5, 3)] {
            let n = 100_000;
            let exact = blocked_fp_rate(n * bits_per_key, k, n);
            let approx = blocked_fp_rate_approx(n * bits_per_key, k, n);
            let relative = (exact - approx).abs() / exact;
            assert!(relative < 0.05, "{bits_per_key} {k}: {exact} vs {approx}");
            // Blocking costs accuracy: never better than the standard layout.
            assert!(exact >= standard_fp_rate(n * bits_per_key, k, n));
        }
    }

    #[test]
    fn blocked_size_meets_its_target() {
        for p in [0.1, 0.01, 0.001, 0.0001] {
            let n = 1_000_000;
            let (bits, k) = blocked_size(n, p);
            assert_eq!(bits % BLOCK_BITS, 0);
            assert!(blocked_fp_rate(bits, k, n) <= p);
            // ... and is not wastefully large.
            let smaller = bits / 100 * 98 / BLOCK_BITS * BLOCK_BITS;
            assert!(blocked_fp_rate(smaller, k, n) > p, "{p}: {bits} bits");
        }
    }

    #[test]
    fn items_from_ones_inverts_the_expectation() {
        let (m, k, n) = (1_000_000_u64, 7_u32, 50_000_u64);
        let expected_ones =
            m as f64 * -((f64::from(k) * n as f64) * (-1.0 / m as f64).ln_1p()).exp_m1();
        let estimate = items_from_ones(m, k, expected_ones.round() as u64);
        assert!((estimate - n as f64).abs() < 5.0, "{estimate}");
        assert_eq!(items_from_ones(m, k, 0), 0.0);
        assert!(items_from_ones(m, k, m).is_finite());
    }

    #[test]
    fn split_block_sizing_is_the_smallest_that_meets_the_rate() {
        for (n, p) in [(10_000, 0.1), (1_000_000, 0.01), (100_000, 0.0001)] {
            let (bits, hashes) = split_block_size(n, p, 1 << 46).unwrap();
            assert_eq!(hashes % SPLIT_WORDS, 0);
            assert!(split_block_fp_rate(bits, hashes, n) <= p, "n={n} p={p}");
            assert!(
                split_block_fp_rate(bits - BLOCK_BITS, hashes, n) > p,
                "n={n} p={p}: one block fewer still meets the rate"
            );
            for other in (SPLIT_WORDS..=MAX_HASHES).step_by(SPLIT_WORDS as usize) {
                assert!(
                    split_block_fp_rate(bits - BLOCK_BITS, other, n) > p,
                    "n={n} p={p}: k={other} meets it with fewer bits"
                );
            }
            // Never below the textbook size, and within a quarter above it.
            let textbook = optimal_bits(n, p);
            assert!(
                bits as f64 >= textbook && (bits as f64) < 1.25 * textbook,
                "{bits} vs {textbook}"
            );
        }
        assert_eq!(split_block_size(1_000_000, 1e-30, 1 << 20), None);
    }

    #[test]
    fn split_block_256_sizing_is_the_smallest_that_meets_the_rate() {
        for (n, p) in [(10_000, 0.1), (1_000_000, 0.01), (100_000, 0.0001)] {
            let (bits, hashes) = split_block_256_size(n, p, 1 << 46).unwrap();
            assert_eq!(hashes % SPLIT_WORDS, 0);
            assert!(split_block_256_fp_rate(bits, hashes, n) <= p, "n={n} p={p}");
            for other in (SPLIT_WORDS..=MAX_HASHES).step_by(SPLIT_WORDS as usize) {
                assert!(
                    split_block_256_fp_rate(bits - BLOCK_BITS, other, n) > p,
                    "n={n} p={p}: k={other} meets it with fewer bits"
                );
            }
            // Smaller buckets fill less evenly: never fewer bits than the
            // 512-bit split-block layout needs.
            let (split_bits, _) = split_block_size(n, p, 1 << 46).unwrap();
            assert!(bits >= split_bits, "{bits} vs {split_bits}");
        }
        assert_eq!(split_block_256_size(1_000_000, 1e-30, 1 << 20), None);
    }

    /// With k = 8 each key sets one bit per word, so the model has a closed
    /// form: after j keys a word's expected fill is 1 - (63/64)^j, a query
    /// tests one bit per word, and the rate is the Poisson(1)-weighted sum
    /// of that fill to the 8th power (one key per block on average).
    #[test]
    fn split_block_model_agrees_with_a_hand_computation() {
        let blocks = 1_000;
        let rate = split_block_fp_rate(blocks * BLOCK_BITS, 8, blocks);
        let hand: f64 = (0..60_u32)
            .map(|j| {
                let poisson = (-1.0_f64).exp() / (1..=j).map(f64::from).product::<f64>();
                let filled = 1.0 - (63.0_f64 / 64.0).powi(j as i32);
                poisson * filled.powi(8)
            })
            .sum();
        assert!(
            (rate - hand).abs() <= 1e-12 + 1e-9 * hand,
            "{rate} vs {hand}"
        );
    }
}
