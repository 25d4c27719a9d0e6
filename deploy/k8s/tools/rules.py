#!/usr/bin/env python3
"""cairn's deployment rules for the rendered Kubernetes manifests (deploy/k8s): security
contexts, `cairn health` exec probes, a TLS Secret per service, resources, default-deny
NetworkPolicies, a single-replica store, ...

  rules.py FILE.yaml     the objects of a rendered stream (`kubectl kustomize DIR`); exit 1 and
                         one line per broken rule, or exit 0

validate.sh runs it on every kustomization it renders.
"""
import sys

import yaml

CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PersistentVolume",
    "StorageClass", "PriorityClass", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
    "IngressClass", "RuntimeClass", "APIService", "CSIDriver", "Node",
}
TEMPLATED = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


def load_stream(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def pod_spec(o):
    kind = o.get("kind")
    spec = o.get("spec", {})
    if kind == "Pod":
        return spec
    if kind in TEMPLATED:
        return spec.get("template", {}).get("spec")
    if kind == "CronJob":
        return spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec")
    return None


def containers(o):
    spec = pod_spec(o) or {}
    return list(spec.get("containers", [])) + list(spec.get("initContainers", []))


# ---- cairn's deployment rules -------------------------------------------------------------

def check(objects):
    """Returns the list of broken rules (empty = all kept)."""
    problems = []
    namespaces = {o["metadata"]["name"]: o for o in objects if o.get("kind") == "Namespace"}
    policies = [o for o in objects if o.get("kind") == "NetworkPolicy"]
    by_kind = lambda kind: [o for o in objects if o.get("kind") == kind]  # noqa: E731

    for ns in namespaces:
        deny = [p for p in policies if p["metadata"].get("namespace") == ns
                and p["spec"].get("podSelector") == {}
                and set(p["spec"].get("policyTypes", [])) == {"Ingress", "Egress"}
                and not p["spec"].get("ingress") and not p["spec"].get("egress")]
        if not deny:
            problems.append(f"namespace {ns}: no default-deny NetworkPolicy (ingress and egress)")
        if "pod-security.kubernetes.io/enforce" not in namespaces[ns]["metadata"].get("labels", {}):
            problems.append(f"namespace {ns}: no pod-security.kubernetes.io/enforce label")
    for o in objects:
        ns = o.get("metadata", {}).get("namespace")
        if o.get("kind") not in CLUSTER_SCOPED and ns not in namespaces:
            problems.append(f"{o['kind']}/{o['metadata']['name']}: namespace {ns!r} is not among the rendered Namespaces")
    for sa in by_kind("ServiceAccount"):
        if sa.get("automountServiceAccountToken") is not False:
            problems.append(f"ServiceAccount {sa['metadata']['name']}: automountServiceAccountToken must be false")

    for w in by_kind("Deployment") + by_kind("StatefulSet"):
        name = f"{w['kind']}/{w['metadata']['name']}"
        ns = w["metadata"].get("namespace")
        level = namespaces.get(ns, {}).get("metadata", {}).get("labels", {}).get("pod-security.kubernetes.io/enforce")
        spec = pod_spec(w)
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{name}: automountServiceAccountToken must be false")
        if not spec.get("serviceAccountName"):
            problems.append(f"{name}: no serviceAccountName (the default account must not be used)")
        psc = spec.get("securityContext", {})
        if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{name}: pod seccompProfile must be RuntimeDefault")
        if level == "restricted":
            if psc.get("runAsNonRoot") is not True:
                problems.append(f"{name}: runAsNonRoot must be true in restricted namespace {ns}")
            if any("hostPath" in v for v in spec.get("volumes", [])):
                problems.append(f"{name}: hostPath volume in restricted namespace {ns}")
        for c in spec.get("containers", []):
            cname = f"{name} container {c['name']}"
            if ":" not in c.get("image", "") and "@" not in c.get("image", ""):
                problems.append(f"{cname}: image {c.get('image')!r} has no tag or digest")
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if r not in res.get(part, {}):
                        problems.append(f"{cname}: resources.{part}.{r} missing")
            if c.get("args", [])[:2] == ["serve", "console"]:
                # The console serves plain HTTP (its mutual TLS is to the services it dials):
                # the kubelet probes its unauthenticated endpoints. Readiness follows the
                # orchestrator and the store; liveness only the process, so an outage of
                # theirs never restarts it.
                for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
                    got = c.get(probe, {}).get("httpGet", {}).get("path")
                    if got != path:
                        problems.append(f"{cname}: {probe} must be an httpGet of {path} (got {got!r})")
            else:
                # Services require client certificates, which kubelet gRPC probes cannot
                # present: probes run `cairn health` in the container, with its TLS settings.
                for probe in ("readinessProbe", "livenessProbe"):
                    cmd = c.get(probe, {}).get("exec", {}).get("command", [])
                    if len(cmd) < 2 or not cmd[0].endswith("cairn") or cmd[1] != "health":
                        problems.append(f"{cname}: {probe} must exec `cairn health` (mutual TLS)")
                # Readiness ("") drops while a dependency is away; restarting would not help.
                for probe in ("livenessProbe", "startupProbe"):
                    if probe not in c:
                        continue
                    cmd = c[probe].get("exec", {}).get("command", [])
                    if cmd[-2:] != ["--service", "liveness"]:
                        problems.append(f"{cname}: {probe} must ask for service 'liveness'")
            env = {e.get("name"): e.get("value") for e in c.get("env", [])}
            mounts = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts", [])}
            secrets = {v.get("name"): v.get("secret", {}).get("secretName", "")
                       for v in spec.get("volumes", []) if "secret" in v}
            if env.get("CAIRN_TLS_DIR") != "/etc/cairn/pki":
                problems.append(f"{cname}: CAIRN_TLS_DIR must be /etc/cairn/pki (mutual TLS)")
            if not secrets.get(mounts.get("/etc/cairn/pki"), "").startswith("cairn-tls-"):
                problems.append(f"{cname}: no Secret cairn-tls-<identity> mounted at /etc/cairn/pki")
            sc = c.get("securityContext", {})
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{cname}: allowPrivilegeEscalation must be false")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{cname}: readOnlyRootFilesystem must be true")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                problems.append(f"{cname}: capabilities.drop must contain ALL")
            if sc.get("privileged"):
                problems.append(f"{cname}: privileged containers are not allowed")
            if level == "restricted" and sc.get("capabilities", {}).get("add"):
                problems.append(f"{cname}: adds capabilities in restricted namespace {ns}")

    stores = [s for s in by_kind("StatefulSet") if s["metadata"]["name"] == "artifact-store"]
    if len(stores) != 1:
        problems.append("artifact-store: expected exactly one StatefulSet")
    for s in stores:
        if s["spec"].get("replicas") != 1:
            problems.append("artifact-store: replicas must be 1 (the single writer)")
        if not s["spec"].get("volumeClaimTemplates"):
            problems.append("artifact-store: no volumeClaimTemplates (its PersistentVolumeClaim)")
    for r in [d for d in by_kind("Deployment") if d["metadata"]["name"] == "sandbox-runner"]:
        spec = pod_spec(r)
        if not any(t.get("key") == "cairn.dev/sandbox" for t in spec.get("tolerations", [])):
            problems.append("sandbox-runner: no toleration for the cairn.dev/sandbox taint")
    for svc in [s for s in by_kind("Service") if s["metadata"]["name"] == "sandbox-runner"]:
        if svc["spec"].get("clusterIP") != "None":
            problems.append("Service sandbox-runner: must be headless (clusterIP: None)")
    for o in by_kind("Deployment") + by_kind("StatefulSet"):
        if o["metadata"]["name"] == "orchestrator" and o["spec"].get("replicas", 1) != 1:
            env = {e.get("name") for c in (pod_spec(o) or {}).get("containers", []) for e in c.get("env", [])}
            needed = {"CAIRN_ORCHESTRATOR_CLUSTER_ETCD_ENDPOINTS", "CAIRN_ORCHESTRATOR_CLUSTER_ADVERTISE_ADDR"}
            if not needed <= env:
                problems.append("orchestrator: more than one replica needs [orchestrator.cluster] (env "
                                + " and ".join(sorted(needed)) + "): without it each resumes every unfinished run")
        for c in (pod_spec(o) or {}).get("containers", []):
            for e in c.get("env", []):
                if e.get("name") == "CAIRN_ORCHESTRATOR_CLUSTER_ETCD_ENDPOINTS" and any(
                        u.strip().startswith("http://") for u in str(e.get("value", "")).split(",")):
                    problems.append(f"{o['metadata']['name']}: etcd endpoints must be https:// "
                                    "(with TLS the replicas dial etcd over mutual TLS and refuse http://)")
        if o["metadata"]["name"] == "console" and o["spec"].get("replicas", 1) != 1:
            problems.append("console: replicas must be 1 (its login sessions live in its memory)")
        for c in (pod_spec(o) or {}).get("containers", []):
            if "--token" in c.get("args", []) or any(a.startswith("--token=") for a in c.get("args", [])):
                problems.append(f"{o['kind']}/{o['metadata']['name']}: a token on the command line (use a Secret: --token-file or an env var from secretKeyRef)")
    return problems


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        problems = check(load_stream(argv[1]))
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as e:
        print(f"rules: error: {argv[1]}: {e}", file=sys.stderr)
        return 1
    for p in problems:
        print(f"rule broken: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
