//! JSON renderer of the report step: the whole diagnosed report (what the
//! terminal shows, plus every process image, path, stack and RSS timeline)
//! for other tools.

use std::io::{self, Write};

use crate::diagnose::Diagnosed;

/// Writes `report` as pretty-printed JSON followed by a newline. The shape is
/// [`Diagnosed`]'s serde form (the report's fields and `diagnosis`);
/// `serde_json::from_str::<Diagnosed>` reads it back.
///
/// # Errors
/// Any error of `out` (serialization itself cannot fail for this type).
pub fn render(report: &Diagnosed, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, report)?;
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::test_support::{self, server_report};

    #[test]
    fn round_trips() {
        let report = server_report();
        let mut out = Vec::new();
        render(&report, &mut out).unwrap();
        let back: Report = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, report);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["processes"][0]["tgid"], 101);
        assert_eq!(value["processes"][0]["role"], "worker");
        assert_eq!(value["processes"][0]["python"]["status"], "python");
        assert_eq!(value["warnings"][0]["kind"], "dropped_records");
        assert_eq!(value["stacks"][0][0]["kind"], "python");
        assert_eq!(value["stacks"][0][0]["function"], "<module>");
    }

    #[test]
    fn growth_stacks_are_written_merged_over_processes() {
        let report = test_support::prefork_report();
        let mut out = Vec::new();
        render(&report, &mut out).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let leak = &value["growth_stacks"][0];
        assert_eq!(leak["tgids"], serde_json::json!([101, 102, 103]));
        assert_eq!(leak["bytes"]["growth_bytes"], 30 * test_support::MIB);
        assert_eq!(leak["growth_share"], 30.0 / 46.0);
        let frames = &value["stacks"][leak["stack"].as_u64().unwrap() as usize];
        assert_eq!(frames[2]["function"], "append");
        assert_eq!(value["growth_stacks"][1]["tgids"], serde_json::json!([101]));
        let back: Report = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn reports_without_growth_stacks_still_read() {
        let mut value = serde_json::to_value(server_report()).unwrap();
        value.as_object_mut().unwrap().remove("growth_stacks");
        let back: Report = serde_json::from_value(value).unwrap();
        assert!(back.growth_stacks.is_empty());
    }
}
