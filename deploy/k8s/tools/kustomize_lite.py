#!/usr/bin/env python3
"""The subset of kustomize that deploy/k8s uses, for machines without kubectl or kustomize,
plus the deployment rules cairn's manifests must keep.

  kustomize_lite.py render DIR          rendered objects as a YAML stream on stdout
  kustomize_lite.py compare A.yaml B.yaml   same objects in both streams? (order ignored)
  kustomize_lite.py check FILE.yaml     cairn's deployment rules (security, probes, limits, ...)

Supported kustomization keys: resources (files and directories), namespace, labels (pairs,
includeTemplates; includeSelectors must be false), images (name, newName, newTag, digest),
replicas, patches (inline or path JSON 6902 operation lists, target by kind/name/namespace
regular expressions). Anything else is refused with a message naming the key: render with real
kustomize then. Transformers run in kustomize's order: patches, namespace, labels, replicas,
images. validate.sh compares this renderer's output with `kubectl kustomize` wherever kubectl
is installed, so the two cannot drift apart unnoticed.
"""
import copy
import difflib
import os
import re
import sys

import yaml

SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches", "replicas"}
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PersistentVolume",
    "StorageClass", "PriorityClass", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
    "IngressClass", "RuntimeClass", "APIService", "CSIDriver", "Node",
}
TEMPLATED = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
# kustomize's legacy output order (kinds not listed come after, by name).
KIND_ORDER = [
    "Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition", "ServiceAccount",
    "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap",
    "Secret", "Endpoints", "Service", "LimitRange", "PriorityClass", "PersistentVolume",
    "PersistentVolumeClaim", "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget",
]
KIND_LAST = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]


class RenderError(Exception):
    pass


def load_stream(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def kustomization_file(directory):
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        p = os.path.join(directory, name)
        if os.path.isfile(p):
            return p
    raise RenderError(f"{directory}: no kustomization.yaml")


def build(directory):
    path = kustomization_file(directory)
    (k,) = load_stream(path) or [{}]
    unknown = set(k) - SUPPORTED_KEYS
    if unknown:
        raise RenderError(f"{path}: {', '.join(sorted(unknown))} not supported by kustomize_lite.py; "
                          "render with kubectl kustomize instead")
    objects = []
    for entry in k.get("resources", []):
        p = os.path.normpath(os.path.join(directory, entry))
        if os.path.isdir(p):
            objects.extend(build(p))
        elif os.path.isfile(p):
            objects.extend(load_stream(p))
        else:
            raise RenderError(f"{path}: resource {entry} not found")
    for patch in k.get("patches", []):
        apply_patch(directory, path, patch, objects)
    if "namespace" in k:
        for o in objects:
            if o.get("kind") not in CLUSTER_SCOPED:
                o.setdefault("metadata", {})["namespace"] = k["namespace"]
    for label in k.get("labels", []):
        if label.get("includeSelectors", False):
            raise RenderError(f"{path}: labels with includeSelectors: true not supported")
        for o in objects:
            o.setdefault("metadata", {}).setdefault("labels", {}).update(label.get("pairs", {}))
            if label.get("includeTemplates", False) and o.get("kind") in TEMPLATED:
                tmeta = o.setdefault("spec", {}).setdefault("template", {}).setdefault("metadata", {})
                tmeta.setdefault("labels", {}).update(label.get("pairs", {}))
                # kustomize counts a StatefulSet's volume claim templates as templates too.
                for claim in o["spec"].get("volumeClaimTemplates", []) if o.get("kind") == "StatefulSet" else []:
                    claim.setdefault("metadata", {}).setdefault("labels", {}).update(label.get("pairs", {}))
    for r in k.get("replicas", []):
        for o in objects:
            if o.get("metadata", {}).get("name") == r["name"] and o.get("kind") in TEMPLATED - {"Job", "DaemonSet"}:
                o["spec"]["replicas"] = r["count"]
    for image in k.get("images", []):
        for o in objects:
            for c in containers(o):
                c["image"] = retag(c.get("image", ""), image)
    return objects


def apply_patch(directory, path, patch, objects):
    target = patch.get("target") or {}
    unknown = set(target) - {"kind", "name", "namespace"}
    if unknown:
        raise RenderError(f"{path}: patch target keys {', '.join(sorted(unknown))} not supported")
    if "path" in patch:
        with open(os.path.join(directory, patch["path"]), encoding="utf-8") as f:
            ops = yaml.safe_load(f)
    else:
        ops = yaml.safe_load(patch.get("patch", ""))
    if not isinstance(ops, list):
        raise RenderError(f"{path}: only JSON 6902 patches (a list of operations) are supported")

    def matches(o):
        meta = o.get("metadata", {})
        for key, value in (("kind", o.get("kind", "")), ("name", meta.get("name", "")),
                           ("namespace", meta.get("namespace", ""))):
            if key in target and not re.fullmatch(target[key], value or ""):
                return False
        return True

    hits = [o for o in objects if matches(o)]
    if not hits:
        raise RenderError(f"{path}: patch target {target} matches no resource")
    for o in hits:
        for op in ops:
            json_patch(o, op, path)


def pointer(doc, ptr, path):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in ptr.split("/")[1:]]
    parent = doc
    for p in parts[:-1]:
        try:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        except (KeyError, IndexError, ValueError) as e:
            raise RenderError(f"{path}: patch path {ptr} does not exist ({e})") from None
    return parent, parts[-1]


def json_patch(doc, op, path):
    parent, last = pointer(doc, op["path"], path)
    kind = op["op"]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if kind == "add":
            parent.insert(index, copy.deepcopy(op["value"]))
        elif kind == "replace":
            parent[index] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[index]
        else:
            raise RenderError(f"{path}: patch op {kind} not supported")
        return
    if kind in ("replace", "remove") and last not in parent:
        raise RenderError(f"{path}: patch path {op['path']} does not exist")
    if kind in ("add", "replace"):
        parent[last] = copy.deepcopy(op["value"])
    elif kind == "remove":
        del parent[last]
    else:
        raise RenderError(f"{path}: patch op {kind} not supported")


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


def retag(ref, image):
    m = re.fullmatch(r"(?P<name>[^@]+?)(?::(?P<tag>[^:/@]+))?(?:@(?P<digest>.+))?", ref)
    if not m or m.group("name") != image["name"]:
        return ref
    name = image.get("newName", m.group("name"))
    if "digest" in image:
        return f"{name}@{image['digest']}"
    tag = image.get("newTag", m.group("tag"))
    digest = m.group("digest")
    return name + (f":{tag}" if tag else "") + (f"@{digest}" if digest and "newTag" not in image else "")


def order_key(o):
    kind = o.get("kind", "")
    meta = o.get("metadata", {})
    if kind in KIND_ORDER:
        rank = (0, KIND_ORDER.index(kind), "")
    elif kind in KIND_LAST:
        rank = (2, KIND_LAST.index(kind), "")
    else:
        rank = (1, 0, kind)
    return rank + (f"{meta.get('namespace', '')}|{meta.get('name', '')}",)


def identity(o):
    meta = o.get("metadata", {})
    return (o.get("apiVersion"), o.get("kind"), meta.get("namespace", ""), meta.get("name"))


def compare(a_path, b_path):
    a = {identity(o): o for o in load_stream(a_path)}
    b = {identity(o): o for o in load_stream(b_path)}
    problems = []
    for key in sorted(set(a) | set(b), key=str):
        if key not in a:
            problems.append(f"only in {b_path}: {key}")
        elif key not in b:
            problems.append(f"only in {a_path}: {key}")
        elif a[key] != b[key]:
            diff = difflib.unified_diff(
                yaml.safe_dump(a[key], sort_keys=True).splitlines(),
                yaml.safe_dump(b[key], sort_keys=True).splitlines(),
                a_path, b_path, lineterm="", n=2)
            problems.append(f"differs: {key}\n" + "\n".join(diff))
    return problems


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
            # Services require client certificates, which kubelet gRPC probes cannot present:
            # probes run `cairn health` in the container, with the container's TLS settings.
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
            problems.append("orchestrator: replicas must be 1 (it resumes unfinished runs at start-up)")
    return problems


def main(argv):
    try:
        if len(argv) == 3 and argv[1] == "render":
            objects = sorted(build(argv[2]), key=order_key)
            yaml.safe_dump_all(objects, sys.stdout, sort_keys=False, default_flow_style=False)
            return 0
        if len(argv) == 4 and argv[1] == "compare":
            problems = compare(argv[2], argv[3])
        elif len(argv) == 3 and argv[1] == "check":
            problems = check(load_stream(argv[2]))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (RenderError, OSError, yaml.YAMLError, KeyError, TypeError) as e:
        print(f"kustomize_lite: error: {e}", file=sys.stderr)
        return 1
    for p in problems:
        print(f"kustomize_lite: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
