//! Decodes CPython 3.11+ location tables (`co_linetable`): the last step of
//! resolving a BPF-recorded frame `(code, instruction index)` to a line, used
//! by `code`.
//!
//! Format: CPython's Objects/locations.md (summarised in
//! notes/python-stacks.md §6). The table is a sequence of entries; each
//! starts with a byte that has bit 7 set, holds `code = (b >> 3) & 15` and
//! covers `(b & 7) + 1` code units (2-byte `_Py_CODEUNIT`s, cache entries
//! included). The line starts at `co_firstlineno` and changes by:
//! - codes 0–9 (short form): 0, one more byte (columns);
//! - codes 10–12 (one-line form): `code - 10`, two more bytes (columns);
//! - code 13 (no columns): a signed varint;
//! - code 14 (long form): a signed varint, then three varints (end line,
//!   column, end column);
//! - code 15: the instructions have no line; the line is unchanged.
//!
//! Varints are little-endian 6-bit chunks with bit 6 as the continuation
//! bit; a signed varint keeps the sign in its lowest bit.

use thiserror::Error;

/// A location table that does not decode.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LineTableError {
    /// The table ends inside an entry.
    #[error("location table truncated at byte {offset} of {len_bytes}")]
    Truncated {
        /// Offset where more bytes were needed.
        offset: usize,
        /// Table length.
        len_bytes: usize,
    },
    /// An entry does not start with a byte that has bit 7 set.
    #[error(
        "location table entry at byte {offset} starts with {byte:#04x}, not a byte with bit 7 set"
    )]
    BadEntryStart {
        /// Offset of the byte.
        offset: usize,
        /// The byte.
        byte: u8,
    },
    /// The table ends before the instruction.
    #[error(
        "instruction index {instr_index} is past the {units} code units the location table covers"
    )]
    IndexPastEnd {
        /// The index asked for.
        instr_index: i32,
        /// Code units covered by the whole table.
        units: u64,
    },
    /// The line deltas lead outside `0..=u32::MAX`, or a varint overflows.
    #[error("location table yields an impossible line at byte {offset}")]
    BadLine {
        /// Offset of the entry.
        offset: usize,
    },
}

/// Line of the instruction at `instr_index` (in code units from
/// `co_code_adaptive`) in a code object whose `co_firstlineno` is
/// `first_lineno` and whose `co_linetable` is `table`.
///
/// A negative `instr_index` (-1: the frame has not started; anything else: a
/// garbage `prev_instr` in a new 3.11/3.12 frame, python-stacks.md §5) gives
/// `first_lineno`. Returns `Ok(None)` for instructions that have no line
/// (code 15; `co_positions()` reports `None` for them).
///
/// # Errors
/// [`LineTableError`] when the table is truncated, malformed, or shorter
/// than `instr_index`.
pub fn line_for_index(
    table: &[u8],
    first_lineno: i32,
    instr_index: i32,
) -> Result<Option<u32>, LineTableError> {
    let Ok(target) = u64::try_from(instr_index) else {
        return u32::try_from(first_lineno)
            .map(Some)
            .map_err(|_| LineTableError::BadLine { offset: 0 });
    };
    let mut reader = Reader { table, pos: 0 };
    let mut line = i64::from(first_lineno);
    let mut unit = 0u64;
    while reader.pos < table.len() {
        let entry_offset = reader.pos;
        let entry = reader.entry()?;
        line = line
            .checked_add(entry.line_delta)
            .ok_or(LineTableError::BadLine {
                offset: entry_offset,
            })?;
        unit += entry.units;
        if target < unit {
            if !entry.has_line {
                return Ok(None);
            }
            return u32::try_from(line)
                .map(Some)
                .map_err(|_| LineTableError::BadLine {
                    offset: entry_offset,
                });
        }
    }
    Err(LineTableError::IndexPastEnd {
        instr_index,
        units: unit,
    })
}

/// One decoded entry.
struct Entry {
    /// Code units covered.
    units: u64,
    /// Change of the line (0 for entries without a line).
    line_delta: i64,
    /// False for code 15.
    has_line: bool,
}

/// A cursor over a location table.
struct Reader<'a> {
    table: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, LineTableError> {
        let byte = *self.table.get(self.pos).ok_or(LineTableError::Truncated {
            offset: self.pos,
            len_bytes: self.table.len(),
        })?;
        self.pos += 1;
        Ok(byte)
    }

    fn skip(&mut self, count: usize) -> Result<(), LineTableError> {
        for _ in 0..count {
            self.byte()?;
        }
        Ok(())
    }

    fn varint(&mut self) -> Result<u64, LineTableError> {
        let start = self.pos;
        let mut byte = self.byte()?;
        let mut value = u64::from(byte & 63);
        let mut shift = 0u32;
        while byte & 64 != 0 {
            byte = self.byte()?;
            shift += 6;
            if shift > 60 {
                return Err(LineTableError::BadLine { offset: start });
            }
            value |= u64::from(byte & 63) << shift;
        }
        Ok(value)
    }

    fn svarint(&mut self) -> Result<i64, LineTableError> {
        let start = self.pos;
        let raw = self.varint()?;
        let magnitude =
            i64::try_from(raw >> 1).map_err(|_| LineTableError::BadLine { offset: start })?;
        Ok(if raw & 1 == 1 { -magnitude } else { magnitude })
    }

    fn entry(&mut self) -> Result<Entry, LineTableError> {
        let offset = self.pos;
        let first = self.byte()?;
        if first & 0x80 == 0 {
            return Err(LineTableError::BadEntryStart {
                offset,
                byte: first,
            });
        }
        let code = (first >> 3) & 15;
        let units = u64::from(first & 7) + 1;
        let (line_delta, has_line) = match code {
            0..=9 => {
                self.skip(1)?;
                (0, true)
            }
            10..=12 => {
                self.skip(2)?;
                (i64::from(code - 10), true)
            }
            13 => (self.svarint()?, true),
            14 => {
                let delta = self.svarint()?;
                for _ in 0..3 {
                    self.varint()?;
                }
                (delta, true)
            }
            _ => (0, false),
        };
        Ok(Entry {
            units,
            line_delta,
            has_line,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::table_fixtures::{check_every_unit, load, Fixture};
    use super::*;

    /// Decodes every instruction of every fixture code object and compares
    /// with CPython's own `co_positions()`; one index past the end is an
    /// error.
    fn check_fixture(json: &str, expect_version_prefix: &str) {
        let fixture = load(json, expect_version_prefix);
        assert!(fixture.codes.len() > 20);
        let checked = check_every_unit(&fixture, line_for_index);
        assert!(checked > 1000);
        for code in &fixture.codes {
            let past = i32::try_from(code.lines.len()).unwrap();
            assert!(matches!(
                line_for_index(&code.table_bytes(), code.firstlineno, past),
                Err(LineTableError::IndexPastEnd { .. })
            ));
        }
    }

    #[test]
    fn matches_cpython_3_11() {
        check_fixture(include_str!("testdata/linetables-3.11.json"), "3.11.");
    }

    #[test]
    fn matches_cpython_3_12() {
        check_fixture(include_str!("testdata/linetables-3.12.json"), "3.12.");
    }

    #[test]
    fn matches_cpython_3_13() {
        check_fixture(include_str!("testdata/linetables-3.13.json"), "3.13.");
    }

    #[test]
    fn far_lines_use_long_deltas() {
        // sample.py's far_lines jumps >5000 lines: code 13/14 svarints.
        let fixture: Fixture = load(include_str!("testdata/linetables-3.12.json"), "3.12.");
        let far = fixture
            .codes
            .iter()
            .find(|code| code.qualname == "far_lines")
            .unwrap();
        let table = far.table_bytes();
        let decoded: Vec<Option<u32>> = (0..far.lines.len())
            .map(|index| {
                let index = i32::try_from(index).unwrap();
                line_for_index(&table, far.firstlineno, index).unwrap()
            })
            .collect();
        let max = decoded.iter().flatten().max().unwrap();
        assert!(*max > 5000, "{max}");
        assert_eq!(decoded, far.lines);
    }

    #[test]
    fn hand_built_entries() {
        // 0xf0 | 1: code 14, 2 units; line +3 (svarint 6), end/col/endcol 0.
        // 0xe8: code 13, 1 unit, line -1 (svarint 3).
        // 0xf8: code 15, 1 unit, no line.
        // 0xd8 | 0: code 11, 1 unit, +1, two column bytes.
        // 0x80: code 0, 1 unit, +0, one column byte.
        let table = [0xf1, 6, 0, 0, 0, 0xe8, 3, 0xf8, 0xd8, 1, 2, 0x80, 5];
        let lines: Vec<_> = (0..6).map(|i| line_for_index(&table, 10, i)).collect();
        assert_eq!(
            lines,
            vec![
                Ok(Some(13)),
                Ok(Some(13)),
                Ok(Some(12)),
                Ok(None),
                Ok(Some(13)),
                Ok(Some(13))
            ]
        );
    }

    #[test]
    fn multi_byte_varint() {
        // code 13 with svarint 0x41 0x01 = 1 | 1 << 6 = 65 -> -32.
        let table = [0xe8, 0x41, 0x01];
        assert_eq!(line_for_index(&table, 100, 0), Ok(Some(68)));
    }

    #[test]
    fn truncated_and_garbage_tables_fail_cleanly() {
        let table = [0xf1, 6, 0, 0, 0, 0xe8, 3];
        for cut in 0..table.len() {
            let result = line_for_index(&table[..cut], 10, 2);
            assert!(result.is_err(), "cut {cut}: {result:?}");
        }
        assert_eq!(
            line_for_index(&[0xe8], 1, 0),
            Err(LineTableError::Truncated {
                offset: 1,
                len_bytes: 1
            })
        );
        assert_eq!(
            line_for_index(&[0x12, 0x80], 1, 0),
            Err(LineTableError::BadEntryStart {
                offset: 0,
                byte: 0x12
            })
        );
        // A varint that never ends within 64 bits.
        assert!(line_for_index(
            &[0xe8, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f],
            1,
            0
        )
        .is_err());
        // A line that goes negative.
        assert!(matches!(
            line_for_index(&[0xe8, 0x0b], 1, 0),
            Err(LineTableError::BadLine { .. })
        ));
        // Deterministic pseudo-random garbage never panics.
        let mut state = 0x1234_5678_u32;
        for _ in 0..2000 {
            let garbage: Vec<u8> = (0..32)
                .map(|_| {
                    state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (state >> 16) as u8
                })
                .collect();
            let _ = line_for_index(&garbage, 1, 7);
        }
    }
}
