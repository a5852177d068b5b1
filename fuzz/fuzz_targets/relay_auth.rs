//! AFL++ target: see `relay_fuzz::fuzz_relay_auth`.
fn main() {
    afl::fuzz!(|data: &[u8]| relay_fuzz::fuzz_relay_auth(data));
}
