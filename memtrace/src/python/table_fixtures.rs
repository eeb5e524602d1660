//! Test support for the line-number decoders (`linetable`, `lnotab`): the
//! fixture files `testdata/gen_linetables.py` and `testdata/gen_lnotabs.py`
//! dump (every code object of a sample module with CPython's own line for
//! each instruction), and the check that a decoder agrees with CPython on
//! every instruction.

use super::linetable::LineTableError;

/// One dumped code object.
#[derive(serde::Deserialize)]
pub(super) struct Code {
    /// `co_qualname` (3.11+) or `co_name`.
    pub(super) qualname: String,
    /// `co_firstlineno`.
    pub(super) firstlineno: i32,
    /// The line table as hex: `co_linetable` (3.10+) or `co_lnotab` (3.9).
    #[serde(alias = "linetable")]
    pub(super) table: String,
    /// CPython's line of each code unit (`None`: no line).
    pub(super) lines: Vec<Option<u32>>,
}

impl Code {
    /// The line table's bytes.
    pub(super) fn table_bytes(&self) -> Vec<u8> {
        (0..self.table.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&self.table[i..i + 2], 16).unwrap())
            .collect()
    }
}

/// A fixture file: the interpreter's version and its code objects.
#[derive(serde::Deserialize)]
pub(super) struct Fixture {
    /// The dumping interpreter's version, e.g. `3.12.1`.
    pub(super) version: String,
    /// Its code objects.
    pub(super) codes: Vec<Code>,
}

/// Parses `json` and checks it was dumped by a CPython `version` (a prefix
/// such as `3.12.`).
pub(super) fn load(json: &str, version: &str) -> Fixture {
    let fixture: Fixture = serde_json::from_str(json).unwrap();
    assert!(fixture.version.starts_with(version), "{}", fixture.version);
    fixture
}

/// Decodes every code unit of every code object of `fixture` with `decode`
/// (table, first line, code unit index) and compares with CPython's line;
/// also index -1 (before the first instruction), which is the first line.
/// Returns how many code units were checked.
pub(super) fn check_every_unit(
    fixture: &Fixture,
    decode: impl Fn(&[u8], i32, i32) -> Result<Option<u32>, LineTableError>,
) -> usize {
    let mut checked = 0;
    for code in &fixture.codes {
        let table = code.table_bytes();
        for (index, want) in code.lines.iter().enumerate() {
            let index = i32::try_from(index).unwrap();
            let got = decode(&table, code.firstlineno, index);
            assert_eq!(
                got,
                Ok(*want),
                "{} {} index {index}",
                fixture.version,
                code.qualname
            );
            checked += 1;
        }
        let first = u32::try_from(code.firstlineno).unwrap();
        assert_eq!(decode(&table, code.firstlineno, -1), Ok(Some(first)));
    }
    checked
}
