//! Writes the seed corpora: `cargo run --bin make_seeds -- <dir>` creates
//! `<dir>/<target>/` with valid inputs of each target.

use relay_fuzz::{call, check_object, relay_auth, valid_object, valid_params, KINDS, METHODS, NOW};
use std::path::Path;

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let d = dir.join(target);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(name), bytes).unwrap();
}

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "seeds".into());
    let dir = Path::new(&dir);
    for (i, m) in METHODS.iter().enumerate() {
        let mut bytes = vec![i as u8];
        bytes.extend(serde_json::to_vec(&valid_params(m)).unwrap());
        call(m, &bytes[1..]).unwrap_or_else(|e| panic!("seed {m}: {e}"));
        write(dir, "parse_params", m, &bytes);
        write(dir, "canonical_json", m, &serde_json::to_vec_pretty(&valid_params(m)).unwrap());
    }
    for (i, sample) in [
        r#"{"b":[1e21,1e-7,-0,0.1,"\u00e9\ud83d\ude00"],"a":{"\u20ac":null,"\r":true}}"#,
        "[]",
        "123456789012345678901234567890",
    ]
    .iter()
    .enumerate()
    {
        write(dir, "canonical_json", &format!("sample{i}"), sample.as_bytes());
    }
    for (i, k) in KINDS.iter().enumerate() {
        let mut bytes = vec![i as u8];
        bytes.extend(valid_object(k).to_string().into_bytes());
        check_object(k, &valid_object(k).to_string()).unwrap_or_else(|e| panic!("seed {k}: {e}"));
        write(dir, "object_validation", k, &bytes);
    }
    let ts = NOW.to_string();
    let parts: Vec<&[u8]> = vec![
        b"message.deliver",
        b"relay-a",
        ts.as_bytes(),
        b"{}",
        b"relay-b",
        b"message.deliver",
        ts.as_bytes(),
        b"{}",
        b"",
    ];
    let mut signed = vec![1u8];
    signed.extend(parts.join(&0xff_u8));
    assert_eq!(relay_auth(&signed), Some(true), "the signed seed is accepted");
    write(dir, "relay_auth", "signed", &signed);
    let mut headers = vec![0u8];
    headers.extend([&b"relay-b"[..], ts.as_bytes(), &[b'A'; 86][..], b"route.get", b"{}", b""].join(&0xff_u8));
    write(dir, "relay_auth", "headers", &headers);
}
