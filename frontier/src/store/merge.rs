//! [`Merged`]: a table's entries with a newer run of changes to them, in
//! key order. A leaf: the held layer's reads and the records' recent table
//! both merge with it.

use super::StoreError;

/// A table's entries merged with a newer run of changes to them, in key
/// order: a newer value replaces the table's, a newer removal (`None`)
/// drops it. The newer run is what is held in memory ([`Merged::new`]),
/// or the recent records over the base table (module `records`).
pub(super) struct Merged<N: Iterator, I: Iterator> {
    newer: std::iter::Peekable<N>,
    stored: std::iter::Peekable<I>,
}

/// A newer run that cannot fail: what is held.
type HeldRun<K, V> = std::iter::Map<
    std::vec::IntoIter<(K, Option<V>)>,
    fn((K, Option<V>)) -> Result<(K, Option<V>), StoreError>,
>;

impl<K, V, I> Merged<HeldRun<K, V>, I>
where
    I: Iterator<Item = Result<(K, V), StoreError>>,
{
    pub(super) fn new(held: Vec<(K, Option<V>)>, stored: I) -> Self {
        Self::over(held.into_iter().map(Ok as fn(_) -> _), stored)
    }
}

impl<N: Iterator, I: Iterator> Merged<N, I> {
    pub(super) fn over(newer: N, stored: I) -> Self {
        Self {
            newer: newer.peekable(),
            stored: stored.peekable(),
        }
    }
}

impl<K: Ord + Copy, V, N, I> Iterator for Merged<N, I>
where
    N: Iterator<Item = Result<(K, Option<V>), StoreError>>,
    I: Iterator<Item = Result<(K, V), StoreError>>,
{
    type Item = Result<(K, V), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let stored_key = match self.stored.peek() {
                Some(Ok((key, _))) => Some(*key),
                Some(Err(_)) => return self.stored.next(),
                None => None,
            };
            let newer_key = match self.newer.peek() {
                Some(Ok((key, _))) => Some(*key),
                Some(Err(_)) => {
                    return match self.newer.next() {
                        Some(Err(error)) => Some(Err(error)),
                        _ => None,
                    };
                }
                None => None,
            };
            match (newer_key, stored_key) {
                (None, None) => return None,
                (Some(newer), stored) if stored.is_none_or(|stored| newer <= stored) => {
                    if stored == Some(newer) {
                        self.stored.next();
                    }
                    match self.newer.next()? {
                        Ok((key, Some(value))) => return Some(Ok((key, value))),
                        Ok((_, None)) => continue,
                        Err(error) => return Some(Err(error)),
                    }
                }
                _ => return self.stored.next(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_entries_replace_and_remove_stored_ones_in_key_order() {
        let stored = vec![(1, "a"), (3, "c"), (5, "e"), (7, "g")];
        let held = vec![
            (0, Some("z")),
            (3, Some("C")),
            (5, None),
            (6, Some("f")),
            (9, None),
        ];
        let merged: Vec<(i32, &str)> = Merged::new(held, stored.into_iter().map(Ok))
            .collect::<Result<_, StoreError>>()
            .unwrap();
        assert_eq!(merged, [(0, "z"), (1, "a"), (3, "C"), (6, "f"), (7, "g")]);
    }
}
