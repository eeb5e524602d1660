//! Human-readable byte sizes (binary units), shared by every step that
//! prints sizes (the diagnosis, the reports, the live view and `diff`), and
//! sizes typed on the command line (`--fail-above`).

/// Binary units after bytes.
const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// `bytes` in binary units with one decimal: `512 B`, `1.5 KiB`, `12.0 MiB`.
pub fn format_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Like [`format_bytes`] with a sign: `+12.0 MiB`, `-4.0 KiB`, `0 B`.
pub fn format_signed_bytes(bytes: i64) -> String {
    let magnitude = format_bytes(bytes.unsigned_abs());
    match bytes.signum() {
        1 => format!("+{magnitude}"),
        -1 => format!("-{magnitude}"),
        _ => magnitude,
    }
}

/// A size as typed on the command line: a number (decimals allowed) and an
/// optional unit, `B`, binary `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB`,
/// or decimal `KB`, `MB`, `GB`, `TB` (case-insensitive, spaces allowed
/// between): `160MiB`, `1.5G`, `500 MB`, `4096`. Returns bytes.
///
/// # Errors
/// A message saying what is accepted, for anything else (a negative or
/// unknown unit, no number, or more than `u64::MAX` bytes).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let help = || {
        format!(
            "`{text}` is not a size: a number and a unit, e.g. 160MiB, 1.5G, 500MB, 4096              (K/M/G/T and KiB/MiB/GiB/TiB are binary, KB/MB/GB/TB decimal)"
        )
    };
    let value: f64 = number.parse().map_err(|_| help())?;
    let multiplier: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(help()),
    };
    let bytes = (value * multiplier).round();
    if bytes >= u64::MAX as f64 {
        return Err(help());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_read_in_both_kinds_of_unit() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("160MiB"), Ok(160 << 20));
        assert_eq!(parse_bytes("160m"), Ok(160 << 20));
        assert_eq!(parse_bytes("1.5G"), Ok(3 << 29));
        assert_eq!(parse_bytes("500 MB"), Ok(500_000_000));
        assert_eq!(parse_bytes("1 GiB"), Ok(1 << 30));
        assert!(parse_bytes("-1M").is_err());
        assert!(parse_bytes("12 parsecs").unwrap_err().contains("160MiB"));
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("1e3").is_err());
    }

    #[test]
    fn bytes_use_binary_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(12 * 1024 * 1024), "12.0 MiB");
        assert_eq!(format_bytes(3 << 30), "3.0 GiB");
        assert_eq!(format_bytes(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn signed_bytes_carry_their_sign() {
        assert_eq!(format_signed_bytes(0), "0 B");
        assert_eq!(format_signed_bytes(2048), "+2.0 KiB");
        assert_eq!(format_signed_bytes(-4096), "-4.0 KiB");
        assert_eq!(format_signed_bytes(i64::MIN), "-8.0 EiB");
    }
}
