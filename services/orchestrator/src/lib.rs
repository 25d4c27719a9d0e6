#[cfg(test)]
mod t {
    #[test]
    fn yaml_value() {
        let v: serde_json::Value = serde_saphyr::from_str("a: 1\nb: [x, {c: true}]\nd: 'on'\ne: 1.5\nf: ~\n").unwrap();
        println!("{v}");
        let dup: Result<serde_json::Value, _> = serde_saphyr::from_str("a: 1\na: 2\n");
        println!("{dup:?}");
        let bad: Result<serde_json::Value, _> = serde_saphyr::from_str("a: [1, 2\n");
        println!("{}", bad.unwrap_err());
    }
}
