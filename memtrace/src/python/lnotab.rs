//! Decodes the line tables of CPython 3.9 (`co_lnotab`) and 3.10
//! (`co_linetable`), whose frames record `f_lasti` instead of an
//! instruction pointer: the 3.9/3.10 half of resolving a BPF-recorded frame
//! to a line, used by `code` (3.11+ tables are in `linetable`).
//!
//! - 3.9 (Objects/lnotab_notes.txt, `PyCode_Addr2Line` in
//!   Objects/codeobject.c): pairs `(byte increment u8, line increment i8)`;
//!   `f_lasti` is a byte offset. The line is `co_firstlineno` plus every line
//!   increment whose pair starts at or before the offset.
//! - 3.10 (Objects/lnotab_notes.txt, `PyLineTable_NextAddressRange` in
//!   Objects/codeobject.c): pairs `(range length u8 in bytes, line delta i8)`,
//!   a delta of -128 meaning the range has no line; `f_lasti` counts 2-byte
//!   code units, so the byte offset looked up is `2 * f_lasti`.

use super::linetable::LineTableError;

/// Line delta that marks a 3.10 range without a line.
const NO_LINE_DELTA: i8 = -128;

/// Line of the instruction at byte offset `f_lasti` in a 3.9 code object:
/// what `PyCode_Addr2Line(code, f_lasti)` returns.
///
/// A negative `f_lasti` (the frame has not started) gives `first_lineno`.
/// An offset past the table's last pair gets the last line, as in CPython.
///
/// # Errors
/// [`LineTableError::BadLine`] when the line leaves `0..=u32::MAX`.
pub fn line_3_9(table: &[u8], first_lineno: i32, f_lasti: i32) -> Result<u32, LineTableError> {
    let mut line = i64::from(first_lineno);
    if let Ok(target) = u64::try_from(f_lasti) {
        let mut addr = 0u64;
        for pair in table.chunks_exact(2) {
            addr += u64::from(pair[0]);
            if addr > target {
                break;
            }
            line += i64::from(pair[1].cast_signed());
        }
    }
    u32::try_from(line).map_err(|_| LineTableError::BadLine { offset: 0 })
}

/// Line of instruction `f_lasti` (in code units) in a 3.10 code object: what
/// `PyCode_Addr2Line(code, 2 * f_lasti)` returns, `None` for an instruction
/// without a line.
///
/// A negative `f_lasti` gives `first_lineno`.
///
/// # Errors
/// [`LineTableError::IndexPastEnd`] when the table ends before the
/// instruction; [`LineTableError::BadLine`] when the line leaves
/// `0..=u32::MAX`.
pub fn line_3_10(
    table: &[u8],
    first_lineno: i32,
    f_lasti: i32,
) -> Result<Option<u32>, LineTableError> {
    let bad_line = |offset| LineTableError::BadLine { offset };
    let Ok(units) = u64::try_from(f_lasti) else {
        return u32::try_from(first_lineno)
            .map(Some)
            .map_err(|_| bad_line(0));
    };
    let target = units * 2;
    let mut line = i64::from(first_lineno);
    let mut end = 0u64;
    for (index, pair) in table.chunks_exact(2).enumerate() {
        let start = end;
        end += u64::from(pair[0]);
        let delta = pair[1].cast_signed();
        let has_line = delta != NO_LINE_DELTA;
        if has_line {
            line += i64::from(delta);
        }
        if (start..end).contains(&target) {
            if !has_line {
                return Ok(None);
            }
            return u32::try_from(line)
                .map(Some)
                .map_err(|_| bad_line(index * 2));
        }
    }
    Err(LineTableError::IndexPastEnd {
        instr_index: f_lasti,
        units: end / 2,
    })
}

#[cfg(test)]
mod tests {
    use super::super::table_fixtures::{check_every_unit, load};
    use super::*;

    /// Decodes every instruction of every fixture code object with `decode`
    /// (given the code unit index) and compares with CPython's own
    /// `PyCode_Addr2Line`; the fixture must hold negative line deltas.
    fn check_fixture(
        json: &str,
        version: &str,
        decode: impl Fn(&[u8], i32, i32) -> Result<Option<u32>, LineTableError>,
    ) {
        let fixture = load(json, version);
        let checked = check_every_unit(&fixture, decode);
        assert!(checked > 1000, "{checked}");
        let negative_deltas: usize = fixture
            .codes
            .iter()
            .map(|code| {
                let table = code.table_bytes();
                table.chunks_exact(2).filter(|p| p[1] >= 0x80).count()
            })
            .sum();
        assert!(negative_deltas > 0);
    }

    #[test]
    fn matches_cpython_3_9() {
        // f_lasti is a byte offset on 3.9: instruction i is at 2 * i.
        check_fixture(
            include_str!("testdata/lnotabs-3.9.json"),
            "3.9.",
            |t, first, i| line_3_9(t, first, if i < 0 { i } else { 2 * i }).map(Some),
        );
    }

    #[test]
    fn matches_cpython_3_10() {
        check_fixture(
            include_str!("testdata/lnotabs-3.10.json"),
            "3.10.",
            line_3_10,
        );
    }

    #[test]
    fn hand_built_3_9_table() {
        // +6 bytes +1 line, +0 bytes +2 lines (a jump > 127), +4 bytes -3.
        let table = [6, 1, 0, 2, 4, 0xfd];
        let lines: Vec<_> = [0, 4, 6, 8, 10, 40]
            .iter()
            .map(|&offset| line_3_9(&table, 10, offset).unwrap())
            .collect();
        assert_eq!(lines, [10, 10, 13, 13, 10, 10]);
        assert_eq!(line_3_9(&[], 7, 100), Ok(7));
        assert!(line_3_9(&[0, 0xff], 0, 0).is_err());
    }

    #[test]
    fn hand_built_3_10_table() {
        // 4 bytes line +1, 2 bytes no line, 0 bytes +5, 2 bytes -2.
        let table = [4, 1, 2, 0x80, 0, 5, 2, 0xfe];
        let lines: Vec<_> = (0..4).map(|i| line_3_10(&table, 10, i)).collect();
        assert_eq!(lines, [Ok(Some(11)), Ok(Some(11)), Ok(None), Ok(Some(14))]);
        assert_eq!(
            line_3_10(&table, 10, 4),
            Err(LineTableError::IndexPastEnd {
                instr_index: 4,
                units: 4
            })
        );
        // An odd trailing byte is ignored, never read past.
        assert!(line_3_10(&[4], 1, 0).is_err());
    }
}
