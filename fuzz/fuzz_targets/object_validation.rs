//! AFL++ target: see `relay_fuzz::fuzz_object_validation`.
fn main() {
    afl::fuzz!(|data: &[u8]| relay_fuzz::fuzz_object_validation(data));
}
