//! The payload of a log record: a group's writes in a compact binary form.
//!
//! Integers little-endian; strings as `u32` length + UTF-8. Decoding checks
//! every length against the bytes left, so damage is an error, never a
//! panic or a huge allocation.

use crate::record::{Reader, RecordError, UrlRecord, put_str};
use crate::revisit::Policy;
use crate::write_ops::{Deletion, KnownUrl, NewUrl, WriteOp};

const TAG_DISCOVER: u8 = 1;
const TAG_KNOWN: u8 = 2;
const TAG_DELETE: u8 = 3;
/// A deletion of one partition's URLs: [`TAG_DELETE`]'s fields, then the
/// partition. A tag of its own, so logs written before it read as before.
const TAG_DELETE_IN_PARTITION: u8 = 4;
/// A chunk of one partition's deletion: [`TAG_DELETE_IN_PARTITION`]'s
/// fields, then the URL its chunk ends before.
const TAG_DELETE_IN_PARTITION_BELOW: u8 = 5;
/// A client's report: [`TAG_KNOWN`]'s fields, then the crawl's revisit
/// policy it is settled under. [`TAG_KNOWN`] is a state written as given.
const TAG_KNOWN_REPORT: u8 = 6;

/// The payload of one record: a group's writes.
#[must_use]
pub fn encode_ops(ops: &[WriteOp]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ops.len() * 128);
    encode_ops_into(ops, &mut out);
    out
}

/// Appends the payload of `ops` to `out`: the log encodes into one buffer
/// it keeps, so that a group costs no allocation of its size.
pub fn encode_ops_into(ops: &[WriteOp], out: &mut Vec<u8>) {
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        match op {
            WriteOp::Discover(new) => {
                out.push(TAG_DISCOVER);
                put_str(out, &new.crawl);
                put_str(out, &new.url);
                out.extend_from_slice(&new.partition.to_le_bytes());
                out.push(u8::from(new.maybe_known));
                put_length_prefixed(out, |out| new.record.encode_into(out));
            }
            WriteOp::Known(known) => {
                out.push(if known.report.is_some() {
                    TAG_KNOWN_REPORT
                } else {
                    TAG_KNOWN
                });
                put_str(out, &known.crawl);
                put_str(out, &known.url);
                out.extend_from_slice(&known.partition.to_le_bytes());
                put_optional(out, known.queue_key.as_deref());
                put_str(out, &known.default_queue);
                out.extend_from_slice(&known.due_at.to_le_bytes());
                out.extend_from_slice(&known.now.to_le_bytes());
                // The metadata travels in a record's form, the one encoding
                // of it the store already has.
                put_length_prefixed(out, |out| {
                    UrlRecord::encode_metadata_into(&known.metadata, out);
                });
                if let Some(policy) = known.report {
                    out.extend_from_slice(&policy.encode());
                }
            }
            WriteOp::Delete(deletion) => {
                // A bound is only meaningful within a partition.
                let below = deletion.partition.and(deletion.urls_below.as_deref());
                out.push(match (deletion.partition, below) {
                    (Some(_), Some(_)) => TAG_DELETE_IN_PARTITION_BELOW,
                    (Some(_), None) => TAG_DELETE_IN_PARTITION,
                    (None, _) => TAG_DELETE,
                });
                put_str(out, &deletion.crawl);
                put_optional(out, deletion.queue.as_deref());
                match deletion.created_before {
                    Some(before) => {
                        out.push(1);
                        out.extend_from_slice(&before.to_le_bytes());
                    }
                    None => out.push(0),
                }
                out.extend_from_slice(&deletion.partitions.to_le_bytes());
                if let Some(partition) = deletion.partition {
                    out.extend_from_slice(&partition.to_le_bytes());
                }
                if let Some(below) = below {
                    put_str(out, below);
                }
            }
        }
    }
}

/// Reads a payload written by [`encode_ops`].
pub fn decode_ops(bytes: &[u8]) -> Result<Vec<WriteOp>, RecordError> {
    let mut reader = Reader { bytes };
    let count = reader.u32()? as usize;
    // Every op takes at least a tag byte and a few lengths: a count beyond
    // the bytes left is damage, refused before allocating.
    if count > reader.bytes.len() {
        return Err(RecordError::Truncated);
    }
    let mut ops = Vec::with_capacity(count);
    for _ in 0..count {
        let op = match reader.u8()? {
            TAG_DISCOVER => WriteOp::Discover(NewUrl {
                crawl: reader.string()?,
                url: reader.string()?,
                partition: reader.u32()?,
                maybe_known: read_flag(&mut reader)?,
                record: UrlRecord::decode(read_bytes(&mut reader)?)?,
            }),
            tag @ (TAG_KNOWN | TAG_KNOWN_REPORT) => WriteOp::Known(KnownUrl {
                crawl: reader.string()?,
                url: reader.string()?,
                partition: reader.u32()?,
                queue_key: read_optional(&mut reader)?,
                default_queue: reader.string()?,
                due_at: reader.u64()?,
                now: reader.u64()?,
                metadata: UrlRecord::decode(read_bytes(&mut reader)?)?.metadata,
                report: if tag == TAG_KNOWN_REPORT {
                    let bytes = reader.take(9)?;
                    Some(Policy::decode(bytes).ok_or(RecordError::UnknownTag(bytes[0]))?)
                } else {
                    None
                },
            }),
            tag @ (TAG_DELETE | TAG_DELETE_IN_PARTITION | TAG_DELETE_IN_PARTITION_BELOW) => {
                WriteOp::Delete(Deletion {
                    crawl: reader.string()?,
                    queue: read_optional(&mut reader)?,
                    created_before: if read_flag(&mut reader)? {
                        Some(reader.u64()?)
                    } else {
                        None
                    },
                    partitions: reader.u32()?,
                    partition: if tag == TAG_DELETE {
                        None
                    } else {
                        Some(reader.u32()?)
                    },
                    urls_below: if tag == TAG_DELETE_IN_PARTITION_BELOW {
                        Some(reader.string()?)
                    } else {
                        None
                    },
                })
            }
            tag => return Err(RecordError::UnknownTag(tag)),
        };
        ops.push(op);
    }
    if !reader.bytes.is_empty() {
        return Err(RecordError::TrailingBytes(reader.bytes.len()));
    }
    Ok(ops)
}

/// Appends what `write` appends, after its length as a `u32`.
fn put_length_prefixed(out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    write(out);
    let length = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&length.to_le_bytes());
}

fn put_optional(out: &mut Vec<u8>, text: Option<&str>) {
    match text {
        Some(text) => {
            out.push(1);
            put_str(out, text);
        }
        None => out.push(0),
    }
}

fn read_bytes<'a>(reader: &mut Reader<'a>) -> Result<&'a [u8], RecordError> {
    let length = reader.u32()? as usize;
    reader.take(length)
}

fn read_flag(reader: &mut Reader<'_>) -> Result<bool, RecordError> {
    match reader.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(RecordError::UnknownTag(other)),
    }
}

fn read_optional(reader: &mut Reader<'_>) -> Result<Option<String>, RecordError> {
    Ok(if read_flag(reader)? {
        Some(reader.string()?)
    } else {
        None
    })
}
