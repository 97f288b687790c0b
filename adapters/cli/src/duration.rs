//! Durations as people write them: `10s`, `500ms`, `2m`, `1m30s`, `1.5s`.
//!
//! A tiny parser instead of a dependency: the CLI only needs a handful of units, and
//! an error that names the accepted forms.

use std::time::Duration;

/// Parses `text` as a duration: one or more `<number><unit>` parts, the unit one of
/// `ms`, `s`, `m`, `h`; a bare `0` is zero. Fractions are allowed (`1.5s`).
pub fn parse(text: &str) -> Result<Duration, String> {
    const FORMS: &str = "write it like 10s, 500ms, 2m or 1m30s";
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(format!("an empty duration; {FORMS}"));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("`{text}` is not a duration; {FORMS}"))?;
        let unit_secs = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3_600.0,
            "" => return Err(format!("`{text}` has no unit; {FORMS}")),
            other => return Err(format!("`{other}` in `{text}` is not a unit; {FORMS}")),
        };
        let part = Duration::try_from_secs_f64(value * unit_secs)
            .map_err(|_| format!("`{text}` is out of range; {FORMS}"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| format!("`{text}` is out of range; {FORMS}"))?;
        rest = next;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_forms_parse() {
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7_200)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_forms_say_what_is_accepted() {
        for bad in ["", "10", "ten s", "5 parsecs", "1x", "-1s", "1e999s"] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("10s, 500ms"), "{bad}: {err}");
        }
    }
}
