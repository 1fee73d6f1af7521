"""deploy/apiserver's authorization wiring, read the way kube-apiserver reads it: the
authorization webhook's kubeconfig (clientcmd's ConfirmUsable), the flags file
(BuiltInAuthorizationOptions.Validate, then the configuration the flags build), the
structured AuthorizationConfiguration (LoadFromData, strict; ValidateAuthorizationConfiguration),
and the kubeadm routes: the ClusterConfiguration's extraArgs and the static pod patch,
each turned into kube-apiserver's command as kubeadm writes it
(tests/support/kube/kubeadm.py) and its flags read as kube-apiserver reads them.

No kube-apiserver runs here, so its rules are encoded in tests/support/kube/
(authorization.py, kubeconfig.py: each names the Kubernetes source it follows). The
files kube opens on the control-plane node are the ones docs/operations.md ("Wire up
kube-apiserver") and each file's own header say to install under one directory, which
kubeadm mounts into the static pod. Each rule family is then shown to refuse a broken
copy of our own file with kube's message, so that a check which cannot fail is caught.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import celpy
import orjson
import pytest
import yaml

from authn_gateway.authorization.webhook import SHIPPED_MATCH_CONDITION, match_condition_warning
from authn_gateway.config import GatewayConfig
from authn_gateway.config.sections import MarkerSettings
from authn_gateway.review.markers import Markers
from authn_gateway.review.tokenreview import render_verdict
from backends.base import Authenticated, UserInfo, Verdict
from tests.support.authorization_helpers import sar_body
from tests.support.kube.authorization import (
    configuration_from_flags,
    load_authorization_configuration,
    match_request,
    parse_flags,
    validate_authorization_configuration,
    validate_authorization_flags,
)
from tests.support.kube.kubeadm import PatchFailed, apiserver_command, apply_json_patch, static_pod
from tests.support.kube.kubeconfig import confirm_usable, load_kubeconfig
from tests.support.kustomize import DEPLOY, config_of, find, render

APISERVER = DEPLOY / "apiserver"
AUTHN_KUBECONFIG = APISERVER / "webhook-kubeconfig.yaml"
AUTHZ_KUBECONFIG = APISERVER / "authz-webhook-kubeconfig.yaml"
AUTHZ_FLAGS = APISERVER / "kube-apiserver-authorization-flags.txt"
AUTHZ_CONFIG = APISERVER / "authorization-config.yaml"
KUBEADM_CONFIG = APISERVER / "kubeadm-config.yaml"
KUBEADM_PATCH = APISERVER / "kubeadm-patches" / "kube-apiserver+json.yaml"
OPERATIONS = DEPLOY.parent / "docs" / "operations.md"


def header_install_path(path: Path) -> str:
    """Where the file's header says it goes on the control-plane node."""
    found = re.search(r"(/etc/kubernetes/\S+?\.yaml)", path.read_text())
    assert found, f"{path.name} does not say where it is installed"
    return found.group(1)


def mount_path() -> str:
    """The host directory kubeadm mounts into kube-apiserver's static pod."""
    config = yaml.safe_load((APISERVER / "kubeadm-config.yaml").read_text())
    (volume,) = config["apiServer"]["extraVolumes"]
    assert volume["hostPath"] == volume["mountPath"]
    return str(volume["mountPath"])


def installed_files() -> set[str]:
    """The regular files on the node, by the docs: step 1 of "Wire up kube-apiserver"
    (kubeconfig.yaml, gateway-ca.crt, client.crt, client.key) and the authorization
    files' own headers."""
    directory = mount_path()
    step = OPERATIONS.read_text().split("## Wire up kube-apiserver", 1)[1].split("\n2. ")[0]
    names = {"kubeconfig.yaml", "gateway-ca.crt", "client.crt", "client.key"}
    for name in names:
        assert f"`{name}`" in step, name
    files = {f"{directory}/{name}" for name in names}
    files |= {header_install_path(AUTHZ_KUBECONFIG), header_install_path(AUTHZ_CONFIG)}
    assert all(f.startswith(directory + "/") for f in files), files
    return files


def on_node() -> Callable[[str], bool]:
    files = installed_files()
    return files.__contains__


def structured() -> dict[str, Any]:
    config, errors = load_authorization_configuration(yaml.safe_load(AUTHZ_CONFIG.read_text()))
    assert errors == []
    return config


def flags() -> dict[str, str]:
    parsed, errors = parse_flags(AUTHZ_FLAGS.read_text().split())
    assert errors == []
    return parsed


def webhook(config: dict[str, Any]) -> dict[str, Any]:
    (hook,) = [a["webhook"] for a in config["authorizers"] if a["type"] == "Webhook"]
    return dict(hook)


# --- the kubeconfig -------------------------------------------------------------------


def test_the_authorization_kubeconfig_is_usable_as_kube_apiserver_loads_it() -> None:
    for path in (AUTHZ_KUBECONFIG, AUTHN_KUBECONFIG):
        config = load_kubeconfig(yaml.safe_load(path.read_text()))
        assert confirm_usable(config, on_node()) == [], path.name


def test_the_authorization_kubeconfig_points_at_the_authorize_path_over_mutual_tls() -> None:
    # The same checks as the TokenReview kubeconfig's (tests/deploy/test_deploy.py), with
    # the path the rendered config's authorization section serves.
    docs = render("base")
    kubeconfig = yaml.safe_load(AUTHZ_KUBECONFIG.read_text())
    cluster = kubeconfig["clusters"][0]["cluster"]
    service = find(docs, "Service", "authn-gateway")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] != "metrics")
    path = config_of(docs)["authorization"].get("path", "/authorize")
    assert cluster["server"] == f"https://{service['spec']['clusterIP']}:{port}{path}"
    assert cluster["certificate-authority"].startswith(mount_path() + "/")
    user = kubeconfig["users"][0]["user"]
    assert user["client-certificate"].startswith(mount_path() + "/")
    assert user["client-key"].startswith(mount_path() + "/")
    assert kubeconfig["current-context"] == kubeconfig["contexts"][0]["name"]
    # The same gateway, certificates and caller as the TokenReview webhook: only the
    # path differs.
    authn = yaml.safe_load(AUTHN_KUBECONFIG.read_text())
    authn["clusters"][0]["cluster"]["server"] = authn["clusters"][0]["cluster"]["server"].replace(
        "/authenticate", path
    )
    assert kubeconfig == authn


# --- the flags ------------------------------------------------------------------------


def test_the_authorization_flags_pass_kube_apiservers_checks() -> None:
    given = flags()
    assert validate_authorization_flags(given) == []
    assert given["authorization-mode"] == "Node,Webhook,RBAC"
    assert given["authorization-webhook-version"] == "v1"
    assert given["authorization-webhook-config-file"] == header_install_path(AUTHZ_KUBECONFIG)
    # What kube-apiserver runs from them is a valid configuration too.
    built = configuration_from_flags(given)
    assert validate_authorization_configuration(built, on_node()) == []
    assert [a["type"] for a in built["authorizers"]] == ["Node", "Webhook", "RBAC"]


def test_the_flags_and_the_structured_configuration_are_one_or_the_other() -> None:
    given = flags()
    both = {**given, "authorization-config": header_install_path(AUTHZ_CONFIG)}
    assert validate_authorization_flags(both) == [
        "--authorization-config can not be specified when --authorization-mode or "
        "--authorization-webhook-* flags are defined"
    ]
    assert "instead of --authorization-mode" in AUTHZ_CONFIG.read_text()
    assert (
        validate_authorization_flags({"authorization-config": both["authorization-config"]}) == []
    )


# --- the structured configuration -----------------------------------------------------


def test_the_structured_configuration_passes_kube_apiservers_checks() -> None:
    config = structured()
    assert validate_authorization_configuration(config, on_node()) == []
    assert [a["type"] for a in config["authorizers"]] == ["Node", "Webhook", "RBAC"]


def test_the_structured_configuration_runs_the_flags_chain_with_a_short_timeout() -> None:
    from_flags, from_file = configuration_from_flags(flags()), structured()
    assert [a["type"] for a in from_file["authorizers"]] == [
        a["type"] for a in from_flags["authorizers"]
    ]
    file_hook, flags_hook = webhook(from_file), webhook(from_flags)
    for key in ("authorizedTTL", "unauthorizedTTL", "subjectAccessReviewVersion",
                "failurePolicy", "connectionInfo"):  # fmt: skip
        assert file_hook[key] == flags_hook[key], key
    # The flags cannot set a timeout (kube takes 30 s); the file asks for 3 s, well above
    # a decision's cost (the gateway answers at once) and under kube's request budget.
    assert (flags_hook["timeout"], file_hook["timeout"]) == (30.0, 3.0)
    # The gateway keeps answers as long as kube-apiserver does.
    cache = GatewayConfig.model_validate(
        {"backends": [DEMO], "authorization": config_of(render("base"))["authorization"]}
    ).authorization
    assert cache is not None
    assert (cache.cache.authorized_ttl_seconds, cache.cache.unauthorized_ttl_seconds) == (
        file_hook["authorizedTTL"],
        file_hook["unauthorizedTTL"],
    )


DEMO = {"name": "demo", "type": "static", "tokens": [{"token": "t", "username": "u"}]}


def evaluate(expression: str, request: dict[str, Any]) -> Any:
    env = celpy.Environment()
    result = env.program(env.compile(expression)).evaluate({"request": celpy.json_to_cel(request)})
    if isinstance(result, celpy.CELEvalError):
        raise AssertionError(f"{expression!r} failed: {result}")
    return result


def deployed_markers() -> dict[str, Any]:
    markers: dict[str, Any] = config_of(render("base")).get("markers", {})
    return markers


def gateway_user(changed: dict[str, Any] | None = None) -> dict[str, Any]:
    """``status.user`` as the gateway renders it with the deploy's markers (``changed``
    over them)."""
    given = {**deployed_markers(), **(changed or {})}
    markers = GatewayConfig.model_validate({"backends": [DEMO], "markers": given}).markers
    user = UserInfo(
        "alice", "u-1", ("developers",), {"alpha.kubernetes.io/identity/roles": ("member",)}
    )
    body = render_verdict(
        "authentication.k8s.io/v1",
        Verdict(Authenticated(user), "keystone"),
        Markers(markers.prefix, markers.stale, markers.backend),
    ).body
    return dict(orjson.loads(body)["status"]["user"])


@pytest.mark.parametrize(
    ("who", "asked"),
    [
        ("the gateway's user", True),
        ("a node", False),
        ("a service account", False),
        ("a certificate user with other extra", False),
    ],
)
def test_the_match_condition_asks_the_webhook_about_the_gateways_users_only(
    who: str, asked: bool
) -> None:
    users = {
        "the gateway's user": gateway_user(),
        "a node": {"username": "system:node:worker-1", "groups": ["system:nodes"]},
        "a service account": {
            "username": "system:serviceaccount:kube-system:coredns",
            "groups": ["system:serviceaccounts"],
            "extra": {"authentication.kubernetes.io/pod-name": ["coredns-1"]},
        },
        "a certificate user with other extra": {
            "username": "admin", "groups": ["system:masters"], "extra": {"team": ["ops"]},
        },
    }  # fmt: skip
    (condition,) = webhook(structured())["matchConditions"]
    spec = sar_body(users[who])["spec"]
    result = evaluate(condition["expression"], match_request(spec))
    assert isinstance(result, celpy.celtypes.BoolType) and bool(result) is asked


# --- the kubeadm routes ---------------------------------------------------------------


def kubeadm_extra_args() -> list[dict[str, str]]:
    args: list[dict[str, str]] = yaml.safe_load(KUBEADM_CONFIG.read_text())["apiServer"][
        "extraArgs"
    ]
    return args


def kubeadm_patch() -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = yaml.safe_load(KUBEADM_PATCH.read_text())
    return ops


def authorization_of(command: list[str]) -> dict[str, str]:
    """kube-apiserver's authorization flags in a static pod's command."""
    assert command[0] == "kube-apiserver"
    given, errors = parse_flags(command[1:])
    assert errors == []
    return given


STRUCTURED_ONLY = "--authorization-config can not be specified when --authorization-mode"


def test_the_kubeadm_config_wires_the_structured_configuration() -> None:
    # kubeadm leaves out its own --authorization-mode when extraArgs name
    # authorization-config (getAPIServerCommand, kubeadm 1.30+).
    given = authorization_of(apiserver_command(kubeadm_extra_args()))
    assert given == {"authorization-config": header_install_path(AUTHZ_CONFIG)}
    assert validate_authorization_flags(given) == []
    # The file it names is installed in the mounted directory and passes kube's checks.
    assert given["authorization-config"].startswith(mount_path() + "/")
    assert on_node()(given["authorization-config"])
    assert validate_authorization_configuration(structured(), on_node()) == []
    # Had kubeadm kept its mode, kube-apiserver would not start.
    kept = {**given, "authorization-mode": "Node,RBAC"}
    assert validate_authorization_flags(kept)[0].startswith(STRUCTURED_ONLY)


def test_the_kubeadm_config_with_the_flags_file_instead_is_the_flags_file() -> None:
    # Its comment's alternative: the flags file's flags as extraArgs, in place of
    # authorization-config; the user's authorization-mode replaces kubeadm's.
    args = [a for a in kubeadm_extra_args() if a["name"] != "authorization-config"]
    args += [{"name": name, "value": value} for name, value in flags().items()]
    given = authorization_of(apiserver_command(args))
    assert given == flags()
    assert validate_authorization_flags(given) == []


def test_the_kubeadm_patch_puts_the_structured_configuration_in_place_of_kubeadms_mode() -> None:
    written = static_pod([])
    assert authorization_of(written["spec"]["containers"][0]["command"]) == {
        "authorization-mode": "Node,RBAC"
    }
    patched = apply_json_patch(written, kubeadm_patch())
    command = patched["spec"]["containers"][0]["command"]
    given = authorization_of(command)
    assert given == {"authorization-config": header_install_path(AUTHZ_CONFIG)}
    assert validate_authorization_flags(given) == []
    # The same kube-apiserver as the ClusterConfiguration route's, but for the order.
    assert sorted(command) == sorted(apiserver_command(kubeadm_extra_args()))
    mounts = patched["spec"]["containers"][0]["volumeMounts"]
    assert any(
        given["authorization-config"].startswith(m["mountPath"] + "/") and m["readOnly"]
        for m in mounts
    )


def test_the_kubeadm_patch_fails_rather_than_start_a_kube_apiserver_that_refuses_its_flags() -> (
    None
):
    # An extraArg that sorts before --authorization-mode moves it from command[3]: the
    # patch's test fails, and kubeadm writes nothing.
    audited = static_pod([{"name": "audit-log-path", "value": "/var/log/kubernetes/audit.log"}])
    with pytest.raises(PatchFailed, match="testing value /spec/containers/0/command/3 failed"):
        apply_json_patch(audited, kubeadm_patch())
    # Appending instead of replacing would leave kube-apiserver both: it refuses that...
    command = audited["spec"]["containers"][0]["command"]
    appended = [*command, f"--authorization-config={header_install_path(AUTHZ_CONFIG)}"]
    assert validate_authorization_flags(authorization_of(appended))[0].startswith(STRUCTURED_ONLY)
    # ...and the flags file's mode appended is a mode named twice (pflag appends).
    doubled = [*command, "--authorization-mode=Node,Webhook,RBAC"]
    assert "has mode specified more than once" in " ".join(
        validate_authorization_flags(authorization_of(doubled))
    )


@pytest.mark.parametrize("changed", [{"backend": False}, {"prefix": "example.com/"}])
def test_markers_off_or_renamed_leave_the_webhook_unasked_and_the_gateway_says_so(
    changed: dict[str, Any],
) -> None:
    # The gateway's warning names the shipped condition, and holds for what kube runs.
    (condition,) = webhook(structured())["matchConditions"]
    assert condition["expression"] == SHIPPED_MATCH_CONDITION
    deployed = MarkerSettings.model_validate(deployed_markers())
    assert match_condition_warning(deployed) is None
    spec = sar_body(gateway_user(changed))["spec"]
    assert bool(evaluate(condition["expression"], match_request(spec))) is False
    line = match_condition_warning(MarkerSettings.model_validate(changed))
    assert line is not None and "never asks this webhook" in line


# --- each rule refuses a broken copy --------------------------------------------------


def broken(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    doc = copy.deepcopy(yaml.safe_load(AUTHZ_CONFIG.read_text()))
    change(doc)
    return doc


def _hook_of(doc: dict[str, Any]) -> dict[str, Any]:
    hook: dict[str, Any] = doc["authorizers"][1]["webhook"]
    return hook


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: _hook_of(doc).__setitem__(key, value)


W = "authorizers[1]"  # the webhook's errors are reported under the authorizer's path
SUPPORTED = "supported values: "


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_set("timeout", "45s"), f'{W}.timeout: Invalid value: "45s": must be > 0s and <= 30s'),
        (lambda d: _hook_of(d).pop("timeout"), f"{W}.timeout: Required value"),
        (
            _set("failurePolicy", "Ignore"),
            f'{W}.failurePolicy: Unsupported value: "Ignore": {SUPPORTED}"NoOpinion", "Deny"',
        ),
        (
            _set("subjectAccessReviewVersion", "v2"),
            f'{W}.subjectAccessReviewVersion: Unsupported value: "v2": {SUPPORTED}"v1", "v1beta1"',
        ),
        (
            lambda d: _hook_of(d).pop("matchConditionSubjectAccessReviewVersion"),
            f"{W}.matchConditionSubjectAccessReviewVersion: Required value: "
            "required if match conditions are specified",
        ),
        (
            _set("connectionInfo", {"type": "KubeConfigFile", "kubeConfigFile": "authz.yaml"}),
            f'{W}.connectionInfo.kubeConfigFile: Invalid value: "authz.yaml": '
            "must be an absolute path",
        ),
        (
            _set("connectionInfo", {"type": "KubeConfigFile", "kubeConfigFile": "/etc/k/a.yaml"}),
            f'{W}.connectionInfo.kubeConfigFile: Invalid value: "/etc/k/a.yaml": '
            "error loading file: stat /etc/k/a.yaml: no such file or directory",
        ),
        (
            _set("matchConditions", [{"expression": "'a' in request.extra"}] * 2),
            f"{W}.matchConditions[1].expression: Duplicate value: \"'a' in request.extra\"",
        ),
        (
            _set("matchConditions", [{"expression": "request.extra["}]),
            f'{W}.matchConditions[0].expression: Invalid value: "request.extra[": '
            "compilation failed",
        ),
        (
            lambda d: d["authorizers"][1].pop("webhook"),
            f"{W}.webhook: Required value: required when type=Webhook",
        ),
        (
            lambda d: d["authorizers"].append({"type": "RBAC", "name": "rbac2"}),
            'authorizers[3].type: Duplicate value: "RBAC"',
        ),
        (
            lambda d: d["authorizers"][0].__setitem__("name", "Node"),
            'authorizers[0].name: Invalid value: "Node": authorizer name is invalid: '
            "a lowercase RFC 1123 subdomain",
        ),
        (
            lambda d: d["authorizers"][2].__setitem__("name", "roles"),
            "expected name rbac for authorizer RBAC instead of roles",
        ),
        (
            lambda d: d["authorizers"][0].__setitem__("type", "Keystone"),
            'authorizers[0].type: Unsupported value: "Keystone"',
        ),
    ],
)
def test_kube_refuses_a_broken_copy_of_the_structured_configuration(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    config, errors = load_authorization_configuration(broken(change))
    assert errors == []
    found = validate_authorization_configuration(config, on_node())
    assert any(e.startswith(message) for e in found), found


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            _set("timeOut", "3s"),
            f'strict decoding error: unknown field "{W}.webhook.timeOut"',
        ),
        (
            _set("timeout", "3 seconds"),
            f'{W}.webhook.timeout: time: invalid duration "3 seconds"',
        ),
        (
            lambda d: d.__setitem__("apiVersion", "apiserver.config.k8s.io/v2"),
            'no kind "AuthorizationConfiguration" is registered for version '
            '"apiserver.config.k8s.io/v2"',
        ),
    ],
)
def test_kube_cannot_load_a_broken_copy_of_the_structured_configuration(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    _, errors = load_authorization_configuration(broken(change))
    assert message in errors, errors


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (
            ["--authorization-mode=Node,Webhook,RBAC"],
            "authorization-mode Webhook's authorization config file not passed",
        ),
        (
            ["--authorization-mode=Node,RBAC", "--authorization-webhook-config-file=/etc/k.yaml"],
            "cannot specify --authorization-webhook-config-file without mode Webhook",
        ),
        (
            ["--authorization-mode=RBAC,RBAC"],
            "authorization-mode \"['RBAC', 'RBAC']\" has mode specified more than once",
        ),
        (
            ["--authorization-mode=Node,Keystone"],
            'authorization-mode "Keystone" is not a valid mode',
        ),
        (
            ["--authorization-mode=RBAC", "--authorization-webhook-cache-authorized-ttl=5"],
            'invalid argument "5" for "--authorization-webhook-cache-authorized-ttl" flag: '
            'time: invalid duration "5"',
        ),
    ],
)
def test_kube_refuses_broken_authorization_flags(words: list[str], message: str) -> None:
    given, errors = parse_flags(words)
    assert errors == []
    assert message in validate_authorization_flags(given)


def test_kube_refuses_a_broken_copy_of_the_kubeconfig() -> None:
    doc = yaml.safe_load(AUTHZ_KUBECONFIG.read_text())
    no_key = copy.deepcopy(doc)
    del no_key["users"][0]["user"]["client-key"]
    config = load_kubeconfig(no_key)
    assert confirm_usable(config, on_node()) == [
        "client-key-data or client-key must be specified for kube-apiserver to use the "
        "clientCert authentication method."
    ]
    elsewhere = copy.deepcopy(doc)
    elsewhere["clusters"][0]["cluster"]["certificate-authority"] = "/etc/kubernetes/pki/ca.crt"
    assert confirm_usable(load_kubeconfig(elsewhere), on_node()) == [
        "unable to read certificate-authority /etc/kubernetes/pki/ca.crt for authn-gateway "
        "due to open /etc/kubernetes/pki/ca.crt: no such file or directory"
    ]
    wrong_context = {**copy.deepcopy(doc), "current-context": "authn"}
    assert confirm_usable(load_kubeconfig(wrong_context), on_node()) == [
        "context was not found for specified context: authn"
    ]
    two_methods = copy.deepcopy(doc)
    two_methods["users"][0]["user"].update(token="t", username="u")
    assert confirm_usable(load_kubeconfig(two_methods), on_node()) == [
        "more than one authentication method found for kube-apiserver; found [token basicAuth], "
        "only one is allowed"
    ]
