//! AFL++ target: see `relay_fuzz::fuzz_parse_params`.
fn main() {
    afl::fuzz!(|data: &[u8]| relay_fuzz::fuzz_parse_params(data));
}
