//! Human-readable byte sizes (binary units), shared by every step that
//! prints sizes: the diagnosis, the reports, the live view and `diff`.

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

#[cfg(test)]
mod tests {
    use super::*;

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
