fn main() {
    println!("throttle-worker: under construction");
}
