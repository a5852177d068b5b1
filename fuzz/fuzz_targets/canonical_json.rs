//! AFL++ target: see `relay_fuzz::fuzz_canonical_json`.
fn main() {
    afl::fuzz!(|data: &[u8]| relay_fuzz::fuzz_canonical_json(data));
}
