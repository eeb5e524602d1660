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
    use serde_json::{json, Value};

    use super::*;
    use crate::aggregate::test_support::MIB;
    use crate::report::fixtures::lifecycle_diagnosed;
    use crate::report::fixtures::{prefork_diagnosed, server_diagnosed};

    fn rendered(report: &Diagnosed) -> Vec<u8> {
        let mut out = Vec::new();
        render(report, &mut out).unwrap();
        out
    }

    #[test]
    fn round_trips_with_the_diagnosis() {
        let report = server_diagnosed();
        let out = rendered(&report);
        assert_eq!(out.last(), Some(&b'\n'));
        let back: Diagnosed = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, report);
        let value: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["processes"][0]["tgid"], 101);
        assert_eq!(value["processes"][0]["role"], "worker");
        assert_eq!(value["processes"][0]["python"]["status"], "python");
        assert_eq!(value["warnings"][0]["kind"], "dropped_records");
        assert_eq!(value["stacks"][0][0]["kind"], "python");
        assert_eq!(value["stacks"][0][0]["function"], "<module>");
        let finding = &value["diagnosis"][0];
        assert_eq!(
            finding["summary"],
            report.diagnosis[0].summary.as_str(),
            "{finding}"
        );
        assert_eq!(
            value["diagnosis"].as_array().unwrap().len(),
            report.diagnosis.len()
        );
    }

    #[test]
    fn every_image_has_its_identity_and_how_it_ended() {
        let report = lifecycle_diagnosed();
        let out = rendered(&report);
        let back: Diagnosed = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, report);
        let value: Value = serde_json::from_slice(&out).unwrap();
        let process = |id: u64| {
            value["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["id"] == id)
                .unwrap()
        };
        let first = process(1);
        assert_eq!(first["tgid"], 201);
        assert_eq!(first["instance"], 1);
        assert_eq!(first["exit_status"], json!({"how": "code", "code": 0}));
        assert_eq!(first["exit_began_by"], "python_finalize");
        assert_eq!(first["rss"]["end_bytes"], 70 * MIB);
        let second = process(3);
        assert_eq!(second["tgid"], 201);
        assert_eq!(second["instance"], 2);
        assert_eq!(
            second["exit_status"],
            json!({"how": "signal", "signal": 9, "core_dumped": false})
        );
        let etl = process(2);
        assert_eq!(etl["image"], 0);
        assert_eq!(etl["next_image"], 4);
        assert_eq!(etl["exec_ns"], 6_000_000_000_u64);
        let sleep = process(4);
        assert_eq!(sleep["image"], 1);
        assert_eq!(sleep["previous_image"], 2);
        assert_eq!(sleep["python"]["status"], "not_python");
        let job = value["paths"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["process"] == 1 && p["peak_held_bytes"] == 50 * MIB)
            .unwrap();
        assert_eq!(job["bytes"]["growth_bytes"], 120 * MIB);
        assert_eq!(job["bytes"]["held_bytes"], 40 * MIB);
    }

    #[test]
    fn growth_stacks_are_written_merged_over_processes() {
        let report = prefork_diagnosed();
        let value: Value = serde_json::from_slice(&rendered(&report)).unwrap();
        let leak = &value["growth_stacks"][0];
        assert_eq!(leak["processes"], json!([1, 2, 3]));
        assert_eq!(leak["bytes"]["growth_bytes"], 30 * MIB);
        assert_eq!(leak["peak_held_bytes"], 30 * MIB);
        assert_eq!(leak["growth_share"], 30.0 / 46.0);
        let frames = &value["stacks"][leak["stack"].as_u64().unwrap() as usize];
        assert_eq!(frames[2]["function"], "append");
        assert_eq!(value["growth_stacks"][1]["processes"], json!([1]));
    }

    #[test]
    fn reports_without_growth_stacks_still_read() {
        let mut value = serde_json::to_value(server_diagnosed()).unwrap();
        value.as_object_mut().unwrap().remove("growth_stacks");
        let back: Diagnosed = serde_json::from_value(value).unwrap();
        assert!(back.growth_stacks.is_empty());
    }
}
