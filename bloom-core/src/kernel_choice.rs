//! Which kernels a filter gets ([`Kernels::for_shape`]): the CPU-specific
//! ones (`accel`) where this CPU runs them, else the portable ones
//! (`kernels`). Apart from both, so that neither imports the other's
//! choice.

use crate::accel;
use crate::kernels::{
    Kernels, contains, contains_standard, insert_exclusive, insert_shared, insert_standard_shared,
};
use crate::layout::Layout;
use crate::probe::Shape;
use crate::sync::AtomicU64;

impl Kernels {
    /// The fastest kernels this CPU runs for `shape`, to be called with
    /// `shape` and the array of the filter it describes.
    pub(crate) fn for_shape(shape: Shape) -> Self {
        Self::choose(shape, accel::available())
    }

    /// The kernels for `shape`, the CPU-specific ones only when
    /// `accelerated` (tests pass `false` to check the portable ones).
    #[cfg_attr(bloom_loom, allow(unused_variables))]
    pub(crate) fn choose(shape: Shape, accelerated: bool) -> Self {
        let portable = Self {
            contains: contains::<AtomicU64>,
            #[cfg(not(bloom_loom))]
            contains_plain: contains::<u64>,
            insert_shared,
            insert_exclusive,
        };
        match shape.layout {
            Layout::Standard => {
                // The hash counts sizing produces down to p near 1e-6;
                // others keep the loop over a run-time count.
                macro_rules! by_hashes {
                    ($($k:literal)*) => {
                        match shape.hashes {
                            $($k => Self::standard::<$k>(accelerated),)*
                            _ => portable,
                        }
                    };
                }
                by_hashes!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21)
            }
            Layout::Blocked => portable,
            Layout::SplitBlock | Layout::SplitBlock256 => {
                #[cfg(not(bloom_loom))]
                if let Some(vector) = accel::split_kernels(shape).filter(|_| accelerated) {
                    return Self {
                        contains: vector.contains,
                        contains_plain: vector.contains_plain,
                        insert_shared: vector.insert_shared,
                        insert_exclusive: vector.insert_exclusive,
                    };
                }
                portable
            }
        }
    }

    /// The standard layout's kernels with `K` hashes: compiled for BMI2
    /// when `accelerated` and this CPU has it.
    #[cfg_attr(bloom_loom, allow(unused_variables))]
    fn standard<const K: u32>(accelerated: bool) -> Self {
        #[cfg(not(bloom_loom))]
        if accelerated && let Some(bmi2) = accel::standard_kernels::<K>() {
            return bmi2;
        }
        Self {
            contains: contains_standard::<K, AtomicU64>,
            #[cfg(not(bloom_loom))]
            contains_plain: contains_standard::<K, u64>,
            insert_shared: insert_standard_shared::<K>,
            insert_exclusive,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::BitArray;
    use crate::hash::KeyHash;
    use crate::kernels::*;
    use crate::probe;

    /// Every kernel a shape can get, on this CPU and portably, answers and
    /// sets bits exactly as the portable code over a run-time hash count
    /// does.
    #[test]
    fn chosen_kernels_match_the_portable_code() {
        for accelerated in [false, accel::available()] {
            check_kernels(accelerated);
        }
    }

    fn check_kernels(accelerated: bool) {
        for layout in Layout::ALL {
            for hashes in [1, 7, 8, 13, 16, 21, 22, 24] {
                if layout.is_split() && hashes % 8 != 0 {
                    continue;
                }
                // Bits in proportion to k: the filter ends half full.
                let words = 336 * hashes as usize;
                let shape = Shape {
                    layout,
                    bits: words as u64 * 64,
                    hashes,
                };
                let kernels = Kernels::choose(shape, accelerated);
                let mut fast = BitArray::zeroed(words);
                let fast_shared = BitArray::zeroed(words);
                let mut portable = BitArray::zeroed(words);
                let (mut found, mut missed) = (0, 0);
                for key in 0..20_000_u32 {
                    // Keys repeat, so that "already there" answers occur.
                    let hash = KeyHash::of(&(key % 15_000).to_le_bytes());
                    let expected =
                        insert_exclusive(portable.lines_mut(), hash, KernelArgs::of(&shape));
                    let label = format!("{layout} k={hashes} key {key}");
                    assert_eq!(
                        kernels.insert_exclusive(&shape, fast.lines_mut(), hash),
                        expected,
                        "{label}"
                    );
                    assert_eq!(
                        kernels.insert_shared(&shape, fast_shared.lines(), hash),
                        expected,
                        "{label}"
                    );
                    // Every other query is of an inserted key.
                    let probe = if key % 2 == 0 {
                        KeyHash::of(&(key / 2 % 15_000).to_le_bytes())
                    } else {
                        KeyHash::of(&(key + 1_000_000).to_le_bytes())
                    };
                    let expected = probe::contains(shape, portable.lines(), probe);
                    assert_eq!(
                        kernels.contains(&shape, portable.lines(), probe),
                        expected,
                        "{label}"
                    );
                    if expected { found += 1 } else { missed += 1 }
                }
                assert!(found > 1_000 && missed > 1_000, "{layout} k={hashes}");
                let words = |array: &BitArray<AtomicU64>| -> Vec<u64> {
                    array
                        .words()
                        .iter()
                        .map(|word| word.load(crate::sync::Ordering::Relaxed))
                        .collect()
                };
                assert_eq!(words(&fast), words(&portable), "{layout} k={hashes}");
                assert_eq!(words(&fast_shared), words(&portable), "{layout} k={hashes}");
                #[cfg(not(bloom_loom))]
                {
                    let plain = portable.convert(AtomicU64::into_inner);
                    for key in 0..20_000_u32 {
                        let probe = KeyHash::of(&(key / 2 + 1_000_000 * (key % 2)).to_le_bytes());
                        assert_eq!(
                            kernels.contains_plain(&shape, plain.lines(), probe),
                            probe::contains(shape, plain.lines(), probe),
                            "{layout} k={hashes} plain, key {key}"
                        );
                    }
                }
            }
        }
    }
}
