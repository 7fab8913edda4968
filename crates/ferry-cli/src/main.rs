//! `ferry`: the command-line tool (info, bench). Placeholder until the CLI lands.
fn main() {
    println!("ferry: see `ferry bench`");
}
