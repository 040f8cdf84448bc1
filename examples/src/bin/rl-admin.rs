//! `rl-admin`: list, inspect and reset rate limits in a running deployment's
//! Redis; see `ratewall_examples::admin`.

fn main() -> std::process::ExitCode {
    ratewall_examples::admin::main()
}
