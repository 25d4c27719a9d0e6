use super::*;

fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn parse(yaml: &str) -> Result<Graph, GraphError> {
    Graph::from_yaml(yaml, "r1", &vars(&[]))
}

fn err(yaml: &str) -> GraphError {
    parse(yaml).expect_err("graph should be refused")
}

#[test]
fn valid_graph_binds_vars_and_infers_dependencies() {
    let g = Graph::from_yaml(
        r#"
title: demo
vars: {name: world, count: 3}
nodes:
  - id: a
    type: write_file
    path: "docs/{{run_id}}/{{vars.name}}.md"
    content: "hello {{ vars.name }} x{{vars.count}}"
  - id: b
    type: write_file
    path: docs/b.md
    content: "a wrote {{nodes.a.path}}"
  - id: c
    type: condition
    if: "nodes.b.bytes > 0"
    then: [d]
  - id: d
    type: write_file
    path: docs/d.md
    content: x
"#,
        "r1",
        &vars(&[("name", "you")]),
    )
    .unwrap();
    // Templates are kept as written; the values are recorded once (run_id, vars).
    let a = g.node("a").unwrap();
    let NodeKind::WriteFile(w) = &a.kind else {
        panic!()
    };
    assert_eq!(w.path.source(), "docs/{{run_id}}/{{vars.name}}.md");
    assert_eq!(g.vars["name"], "you");
    assert_eq!(g.vars["count"], "3");
    assert_eq!(g.node("b").unwrap().needs, vec!["a"]);
    assert_eq!(g.node("c").unwrap().needs, vec!["b"]);
    assert_eq!(g.node("d").unwrap().needs, vec!["c"]);
    assert_eq!(g.downstream("b"), vec!["b", "c", "d"]);
    // Resolved form round-trips to the same graph.
    let resolved = g.to_resolved_json();
    let again = Graph::from_value(resolved.clone(), "r1", &BTreeMap::new()).unwrap();
    assert_eq!(again.to_resolved_json(), resolved);
    assert_eq!(again.nodes, g.nodes);
}

#[test]
fn cycle_is_named() {
    let e = err(r#"
nodes:
  - {id: a, type: write_file, path: docs/a, content: x, needs: [c]}
  - {id: b, type: write_file, path: docs/b, content: x, needs: [a]}
  - {id: c, type: write_file, path: docs/c, content: "{{nodes.b.path}}"}
"#);
    assert_eq!(e.field.as_deref(), Some("needs"));
    assert!(e.message.contains("cycle"), "{e}");
    for id in ["a", "b", "c"] {
        assert!(e.message.contains(id), "{e}");
    }
}

#[test]
fn self_need_and_unknown_need() {
    let e = err("nodes:\n  - {id: a, type: write_file, path: docs/a, content: x, needs: [a]}\n");
    assert_eq!(
        (e.node.as_deref(), e.field.as_deref()),
        (Some("a"), Some("needs"))
    );
    let e = err("nodes:\n  - {id: a, type: write_file, path: docs/a, content: x, needs: [nope]}\n");
    assert!(e.message.contains("unknown node `nope`"), "{e}");
    assert_eq!(e.node.as_deref(), Some("a"));
}

#[test]
fn bad_templates_name_node_and_field() {
    let e =
        err("nodes:\n  - {id: a, type: write_file, path: docs/a, content: '{{nodes.zz.path}}'}\n");
    assert_eq!(
        (e.node.as_deref(), e.field.as_deref()),
        (Some("a"), Some("content"))
    );
    assert!(e.message.contains("unknown node `zz`"), "{e}");

    let e = err(r#"
nodes:
  - {id: t, type: sandbox_run, language: python, code: "print(1)"}
  - {id: r, type: write_file, path: docs/r, content: "{{nodes.t.exitcode}}"}
"#);
    assert_eq!(
        (e.node.as_deref(), e.field.as_deref()),
        (Some("r"), Some("content"))
    );
    assert!(
        e.message.contains("no output `exitcode`") && e.message.contains("exit_code"),
        "{e}"
    );

    let e = err("nodes:\n  - {id: a, type: write_file, path: 'docs/{{vars.who}}', content: x}\n");
    assert_eq!(e.field.as_deref(), Some("path"));
    assert!(e.message.contains("unknown variable `vars.who`"), "{e}");

    let e = err("nodes:\n  - {id: a, type: write_file, path: docs/a, content: 'x {{ run_id'}\n");
    assert!(e.message.contains("unterminated"), "{e}");
    assert_eq!(e.node.as_deref(), Some("a"));

    let e = err("nodes:\n  - {id: a, type: write_file, path: docs/a, content: '{{item}}'}\n");
    assert!(e.message.contains("only available inside a map"), "{e}");

    let e = err(
        "nodes:\n  - {id: a, type: write_file, path: docs/a, content: x, when: 'nodes.q.value'}\n",
    );
    assert_eq!(e.field.as_deref(), Some("when"));
}

#[test]
fn code_and_code_file_both_is_an_error() {
    let e = err(r#"
nodes:
  - id: s
    type: sandbox_run
    language: python
    code: "print(1)"
    code_file: docs/x.py
"#);
    assert_eq!(
        (e.node.as_deref(), e.field.as_deref()),
        (Some("s"), Some("code_file"))
    );
    assert!(e.message.contains("both"), "{e}");
    let e = err("nodes:\n  - {id: s, type: sandbox_run, language: python}\n");
    assert_eq!(e.field.as_deref(), Some("code"));
    let e = err("nodes:\n  - {id: s, type: sandbox_run, language: ruby, code: x}\n");
    assert_eq!(e.field.as_deref(), Some("language"));
}

#[test]
fn sandbox_defaults_and_prefix_rules() {
    let g = parse("nodes:\n  - {id: s, type: sandbox_run, language: python, code: 'print(1)', store_output: res}\n  - {id: w, type: write_file, path: docs/w, content: '{{vars.res.exit_code}}'}\n").unwrap();
    let NodeKind::SandboxRun(s) = &g.node("s").unwrap().kind else {
        panic!()
    };
    assert_eq!(s.output_prefix.source(), "docs/artifacts/{{run_id}}");
    assert_eq!(s.allowed_prefixes[1].source(), ".cairn/runs/{{run_id}}/");
    assert_eq!(g.node("w").unwrap().needs, vec!["s"]);
    assert_eq!(g.store_output_node("res"), Some("s"));

    let e = err("nodes:\n  - {id: s, type: sandbox_run, language: python, code: x, output_prefix: workspace/out}\n");
    assert_eq!(e.field.as_deref(), Some("output_prefix"));
    let e = err("nodes:\n  - {id: s, type: sandbox_run, language: python, code: x, input_files: ['../etc/passwd']}\n");
    assert_eq!(e.field.as_deref(), Some("input_files[0]"));
    assert!(e.message.contains(".."), "{e}");
    let e = err("nodes:\n  - {id: s, type: sandbox_run, language: python, code: 'print(1)', store_output: res}\n  - {id: w, type: write_file, path: docs/w, content: '{{vars.res.nope}}'}\n");
    assert!(e.message.contains("no field `nope`"), "{e}");
}

#[test]
fn unknown_fields_and_types() {
    let e = err("nodes:\n  - {id: a, type: write_file, path: docs/a, contnet: x}\n");
    assert_eq!(e.node.as_deref(), Some("a"));
    assert!(e.message.contains("contnet"), "{e}");
    let e = err("nodes:\n  - {id: a, type: teleport}\n");
    assert_eq!(e.field.as_deref(), Some("type"));
    assert!(e.message.contains("write_file"), "{e}");
    let e = err("titel: x\nnodes:\n  - {id: a, type: gate}\n");
    assert!(e.message.contains("titel"), "{e}");
    let e = err("nodes:\n  - {id: a, type: gate}\n  - {id: a, type: gate}\n");
    assert!(e.message.contains("unique"), "{e}");
    let e = err("nodes:\n  - {id: 'a.b', type: gate}\n");
    assert!(e.message.contains("letters"), "{e}");
    let e = err("nodes: []\n");
    assert_eq!(e.field.as_deref(), Some("nodes"));
    assert!(parse("nodes: [\n").unwrap_err().message.contains("YAML"));
    let e = err("nodes:\n  - {id: a, type: write_file, path: /etc/x, content: x}\n");
    assert_eq!(e.field.as_deref(), Some("path"));
}

#[test]
fn map_body_and_item_refs() {
    let g = parse(
        r#"
nodes:
  - id: list
    type: tool_call
    tool: list_files
    args: {prefix: docs}
  - id: fan
    type: map
    over: "{{nodes.list.paths}}"
    parallelism: 2
    node:
      type: write_file
      path: "docs/out/{{index}}.txt"
      content: "{{item}} of {{run_id}}"
"#,
    )
    .unwrap();
    let fan = g.node("fan").unwrap();
    assert_eq!(fan.needs, vec!["list"]);
    let NodeKind::Map(m) = &fan.kind else {
        panic!()
    };
    assert_eq!(m.parallelism, 2);
    let NodeKind::WriteFile(w) = &m.node.kind else {
        panic!()
    };
    assert_eq!(w.content.source(), "{{item}} of {{run_id}}");
    let e = err("nodes:\n  - {id: m, type: map, over: [1], node: {type: gate}}\n");
    assert_eq!(e.field.as_deref(), Some("type"));
    let e = err(
        "nodes:\n  - {id: m, type: map, over: 3, node: {type: write_file, path: a, content: b}}\n",
    );
    assert_eq!(e.field.as_deref(), Some("over"));
    let e = err("nodes:\n  - {id: m, type: map, over: [1], node: {type: write_file, path: 'docs/{{index}}', contents: b}}\n");
    assert_eq!(e.node.as_deref(), Some("m.item"));
}

#[test]
fn condition_branches_must_exist() {
    let e = err("nodes:\n  - {id: c, type: condition, if: 'true', then: [x]}\n");
    assert_eq!(
        (e.node.as_deref(), e.field.as_deref()),
        (Some("c"), Some("then"))
    );
    let e = err("nodes:\n  - {id: c, type: condition, if: 'true &&'}\n");
    assert_eq!(e.field.as_deref(), Some("if"));
}

#[test]
fn tool_and_deliver_checks() {
    let e = err("nodes:\n  - {id: t, type: tool_call, tool: \"Rm/Rf\", args: {}}\n");
    assert_eq!(e.field.as_deref(), Some("args"));
    assert!(e.message.contains("read_file"), "{e}");
    // Other names may be installed tools: the orchestrator checks its tools_dir at submit.
    assert!(parse("nodes:\n  - {id: t, type: tool_call, tool: rm_rf, args: {}}\n").is_ok());
    let e = err("nodes:\n  - {id: t, type: tool_call, tool: read_file, args: {}}\n");
    assert!(e.message.contains("path"), "{e}");
    let e = err(
        "nodes:\n  - {id: d, type: deliver, target: {type: carrier_pigeon}, files: [docs/a]}\n",
    );
    assert_eq!(e.field.as_deref(), Some("target"));
    let e = err(
        "nodes:\n  - {id: t, type: tool_call, tool: read_file, args: {path: '{{nodes.x.y}}'}}\n",
    );
    assert_eq!(e.field.as_deref(), Some("args.path"));
}

/// docs/graph.schema.json lists exactly the node types and fields the parser accepts.
#[test]
fn schema_matches_the_parser() {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../../docs/graph.schema.json")).unwrap();
    let names = |v: &serde_json::Value| -> BTreeSet<String> {
        v.as_object().unwrap().keys().cloned().collect()
    };
    let types: Vec<&str> = schema["$defs"]["node"]["properties"]["type"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(types, NODE_TYPES);
    let common = names(&schema["$defs"]["common"]["properties"]);
    let expected_common: BTreeSet<String> = [
        "id",
        "type",
        "title",
        "needs",
        "when",
        "trigger",
        "retry",
        "timeout_s",
        "ingest",
        "ingest_overwrite",
        "result",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(common, expected_common);
    for ty in NODE_TYPES {
        let props = names(&schema["$defs"][*ty]["properties"]);
        if *ty == "map" {
            let e = err("nodes:\n  - {id: node1, type: map, over: [1], node: {type: echo}, zzz_unknown: 1}\n");
            let listed: BTreeSet<String> = e
                .message
                .rsplit("a map has ")
                .next()
                .unwrap()
                .split(", ")
                .map(|s| s.trim().to_owned())
                .collect();
            assert_eq!(listed, props, "map");
            continue;
        }
        let e = err(&format!(
            "nodes:\n  - {{id: node1, type: {ty}, zzz_unknown: 1}}\n"
        ));
        assert!(
            e.message.contains("unknown field `zzz_unknown`"),
            "{ty}: {e}"
        );
        let listed: BTreeSet<String> = e
            .message
            .split("expected")
            .nth(1)
            .unwrap_or_default()
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        assert_eq!(listed, props, "{ty}: the schema and the parser disagree");
    }
}

/// `overwrite` of an ingest node and `ingest_overwrite` of any node: a word, or a flag
/// (true = always); the default updates only what ingest wrote.
#[test]
fn ingest_overwrite_policies() {
    let node = |extra: &str| {
        let g = parse(&format!(
            "nodes:\n  - {{id: a, type: write_file, path: docs/a.md, content: x{extra}}}\n  - {{id: i, type: ingest, doc_path: docs/a.md, needs: [a]{extra2}}}\n",
            extra2 = extra.replace("ingest_overwrite", "overwrite"),
        ))
        .unwrap();
        let a = g.node("a").unwrap().ingest_overwrite;
        let NodeKind::Ingest(i) = &g.node("i").unwrap().kind else {
            panic!("not an ingest node")
        };
        (a, i.overwrite)
    };
    assert_eq!(node(""), (Overwrite::Ingested, Overwrite::Ingested));
    assert_eq!(
        node(", ingest_overwrite: always"),
        (Overwrite::Always, Overwrite::Always)
    );
    assert_eq!(
        node(", ingest_overwrite: never"),
        (Overwrite::Never, Overwrite::Never)
    );
    assert_eq!(
        node(", ingest_overwrite: true"),
        (Overwrite::Always, Overwrite::Always)
    );
    assert_eq!(
        node(", ingest_overwrite: false"),
        (Overwrite::Ingested, Overwrite::Ingested)
    );
    let e = err("nodes:\n  - {id: a, type: write_file, path: docs/a.md, content: x, ingest_overwrite: sometimes}\n");
    assert!(e.message.contains("never, ingested, always"), "{e}");
    assert_eq!(e.field.as_deref(), Some("ingest_overwrite"));
}
