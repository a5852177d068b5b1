//! RFC 8785 canonical JSON against the reference vectors (copied from the
//! JCS reference implementation into `tests/vectors/`).

use relay_schemas::encoding::jcs;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/rfc8785")
}

#[test]
fn jcs_matches_every_rfc8785_reference_vector() {
    let mut n = 0;
    for entry in std::fs::read_dir(vectors().join("input")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        let input: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let expected = std::fs::read(vectors().join("output").join(&name)).unwrap();
        assert_eq!(String::from_utf8(jcs(&input).unwrap()).unwrap(), String::from_utf8(expected).unwrap(), "{name:?}");
        n += 1;
    }
    assert_eq!(n, 6);
}

#[test]
fn jcs_serializes_100k_es6_number_cases() {
    let file = std::fs::File::open(vectors().join("es6-numbers-100k.txt.gz")).unwrap();
    let reader = BufReader::new(flate2::read::GzDecoder::new(file));
    let mut n = 0;
    for line in reader.lines() {
        let line = line.unwrap();
        let (hex, expected) = line.split_once(',').unwrap();
        let bits = u64::from_str_radix(hex, 16).unwrap();
        let value = f64::from_bits(bits);
        if !value.is_finite() {
            continue; // not representable in JSON; the reference file has none
        }
        let got = String::from_utf8(jcs(&value).unwrap()).unwrap();
        assert_eq!(got, expected, "ieee {hex}");
        n += 1;
    }
    assert_eq!(n, 100_000);
}
