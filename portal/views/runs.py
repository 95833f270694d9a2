"""The portal's pages about what touches a node: runs and their live log, artifacts, sites, nodes, credentials.

Every object is reached through its parent pilot (portal.access); downloads included.
"""

from __future__ import annotations

import ast
import io
import ipaddress
import os
import shlex
import tarfile
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_POST

from gates import lifecycle
from gates.models import AuditAction
from gates.policy import Act
from portal import access, notifications
from portal.access import get_for_user, get_gate_for_user, get_pilot_for_user
from portal.forms import CredentialForm, NodeForm, SiteForm
from runners.agents import agent_env, control_plane_url, create_agent, default_state, revoke_agents
from runners.config import COLD_START_FACTOR, COLD_START_FLOOR_S, HEALTH_TIMEOUT_MAX_S, DeploymentSettingsError
from runners.credentials import create_credential
from runners.deployment import start_up
from runners.dispatch import dispatch_contact
from runners.engine import request_cancel
from runners.models import Credential, Job, Node, Site, SiteAgent, Status, job_nodes, lease_holder, same_parties
from runners.progress import LOG_BATCH, Chunk, job_progress, log_since
from runners.runs import RunRefused, start_gate_run
from runners.ssh import accept_host_key

POLL_SECONDS = 1


def _progress(job: Job) -> dict:
    """Step n of N, requests done of total and each step's row, with each status's label."""
    progress = job_progress(job)
    labels = dict(Status.choices)
    for step in progress["steps"]:
        step["status_label"] = labels.get(step["status"], step["status"])
    return progress


def _job_for_user(request: HttpRequest, code: UUID) -> tuple[Job, object]:
    return get_for_user(
        request,
        Job.objects.select_related("gate", "site", "created_by", "pilot__customer", "pilot__vendor"),
        code,
        "pilot",
    )


def log_html(chunks: list[Chunk]) -> SafeString:
    """The log lines as HTML, built here rather than in a template loop: a page may carry hundreds of chunks."""
    return mark_safe(
        "".join(  # noqa: S308 - every value is escaped or an integer
            f'<span class="chunk st-{escape(c.stream)}" data-seq="{int(c.seq)}">'
            + "".join((f'<span class="lbl">{escape(label)}</span> ' if label else "") + escape(line)
                      for label, line in c.lines())
            + "</span>"
            for c in chunks
        )
    )


def _status_context(request: HttpRequest, job: Job, pilot) -> dict:
    progress = _progress(job)
    return {
        "job": job,
        "pilot": pilot,
        "steps": progress["steps"],
        "progress": progress,
        # A run on simulated nodes says so wherever it is shown, whatever its time scale.
        "simulated": job.steps.filter(node__simulated=True).exists(),
        "can_cancel": access.offers(pilot, request.user, Act.CANCEL_RUN, job),
        "waiting_queue": _waiting_queue(job),
        "waiting_nodes": _waiting_nodes(job),
    }


def _waiting_nodes(job: Job) -> dict | None:
    """A run waiting for nodes another run holds: which node, and that run (gate and short code only)."""
    if job.is_finished or not job.waiting_for:
        return None
    holder = job.waiting_on
    node = next((n for n in job_nodes(job) if holder is not None and lease_holder(n) == holder), None)
    if holder is not None and not same_parties(holder, job):
        # Another pilot's run (perhaps another organisation's): neither its code nor its gate is told.
        return {"node": node.name if node else "", "other_pilot": True, "run": "", "gate": ""}
    return {"node": node.name if node else "", "run": str(holder.code)[:8] if holder else "",
            "gate": (holder.gate.label if holder.gate_id else holder.get_kind_display()) if holder else ""}


def _waiting_queue(job: Job) -> str:
    """The worker queue of a run that nobody has picked up for a minute (no step started), else ''."""
    if job.is_finished or job.site_id is None or job.waiting_for or timezone.now() - job.created < timedelta(seconds=60):
        return ""
    if job.steps.exclude(status=Status.PENDING).exists() or job.steps.filter(started__isnull=False).exists():
        return ""
    return job.site.queue


# ── Runs ──────────────────────────────────────────────────────────────────────────────────────


@login_required
def run_detail(request: HttpRequest, code: UUID) -> HttpResponse:
    job, pilot = _job_for_user(request, code)
    chunks = log_since(job, 0)
    artifacts = list(job.artifacts.select_related("node"))
    return render(
        request,
        "runners/run.html",
        {
            **_status_context(request, job, pilot),
            "chunks": chunks,
            "log_html": log_html(chunks),
            "last_seq": chunks[-1].seq if chunks else 0,
            "more": len(chunks) == LOG_BATCH,
            "artifacts": artifacts,
            "can_download_raw": access.offers(pilot, request.user, Act.TAKE_RAW_DATA, pilot),
            "poll_seconds": POLL_SECONDS,
        },
    )


@login_required
def run_log(request: HttpRequest, code: UUID) -> HttpResponse:
    """htmx: the chunks numbered after ?after=<seq>, the refreshed status panel, and the next poller."""
    job, pilot = _job_for_user(request, code)
    try:
        after = max(0, int(request.GET.get("after", "0")))
    except ValueError:
        return HttpResponse(_("“after” must be a chunk number."), status=400)
    chunks = log_since(job, after)
    last = chunks[-1].seq if chunks else after
    return render(
        request,
        "runners/_log_update.html",
        {
            "artifacts": list(job.artifacts.select_related("node")),
            "can_download_raw": access.offers(pilot, request.user, Act.TAKE_RAW_DATA, pilot),
            **_status_context(request, job, pilot),
            "chunks": chunks,
            "log_html": log_html(chunks),
            "last_seq": last,
            "more": len(chunks) == LOG_BATCH or (job.is_finished and last < job.chunk_count),
            "poll_seconds": POLL_SECONDS,
        },
    )


@login_required
@require_POST
def run_start(request: HttpRequest, code: UUID, number: int) -> HttpResponse:
    gate = get_gate_for_user(request, code, number)
    access.require_act(gate.pilot, request.user, Act.START_RUN)
    try:
        job = start_gate_run(gate, request.user)
    except lifecycle.TransitionRefused as refused:
        messages.error(request, refused.message)
    except (RunRefused, DeploymentSettingsError) as refused:
        messages.error(request, str(refused))
    else:
        return redirect("run", job.code)
    return redirect("gate", gate.pilot.code, gate.number)


@login_required
@require_POST
def run_cancel(request: HttpRequest, code: UUID) -> HttpResponse:
    job, pilot = _job_for_user(request, code)
    access.require_act(pilot, request.user, Act.CANCEL_RUN)
    try:
        request_cancel(job, request.user)
    except lifecycle.TransitionRefused as refused:
        messages.info(request, refused.message)
    else:
        messages.success(request, _("Cancel requested: remote processes are being stopped and torn down."))
    return redirect("run", job.code)


@login_required
def artifact_download(request: HttpRequest, code: UUID) -> HttpResponse:
    return access.serve_artifact(access.artifact_for(request.user, code, may=access.RAW_DATA))


# ── Sites, nodes, credentials ─────────────────────────────────────────────────────────────────


@login_required
def sites(request: HttpRequest, code: UUID) -> HttpResponse:
    pilot = get_pilot_for_user(request, code)
    site_list = list(
        pilot.sites.prefetch_related(
            Prefetch("nodes", queryset=Node.objects.select_related("credential", "jump_host")),
            Prefetch(
                "credentials",
                queryset=Credential.objects.only(
                    "id", "code", "site_id", "name", "key_type", "public_fingerprint", "created"
                ),
            ),
        )
    )
    can_operate = access.offers(pilot, request.user, Act.OPERATE_NODES, pilot)
    agents = {}
    for agent in SiteAgent.objects.filter(site__pilot=pilot, revoked_at=None).order_by("created"):
        agents[agent.site_id] = agent  # the newest active one per site
    for site in site_list:
        site.agent = agents.get(site.pk)
        if can_operate:
            site.node_form = NodeForm(site=site, prefix=f"n-{site.code}")
            site.credential_form = CredentialForm(prefix=f"c-{site.code}")
    return render(
        request,
        "runners/sites.html",
        {
            "pilot": pilot,
            "sites": site_list,
            "can_operate": can_operate,
            "site_form": SiteForm() if can_operate else None,
        },
    )


@login_required
@require_POST
def site_create(request: HttpRequest, code: UUID) -> HttpResponse:
    pilot = get_pilot_for_user(request, code)
    access.require_act(pilot, request.user, Act.OPERATE_NODES)
    form = SiteForm(request.POST)
    if form.is_valid():
        site = Site(pilot=pilot, **form.cleaned_data)
        try:
            site.full_clean()  # the model's own rules too (a site's queue is never the control tier's)
        except ValidationError as error:
            for field, errors in error.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
    if form.is_valid():
        site.save()
        lifecycle.audit(pilot, request.user, AuditAction.SITE_CREATED, site, name=site.name, queue=site.queue)
        messages.success(request, _("Site %(name)s created.") % {"name": site.name})
    else:
        _form_errors(request, form)
    return redirect("sites", pilot.code)


@login_required
@require_POST
def site_agent_create(request: HttpRequest, code: UUID) -> HttpResponse:
    """A fresh credential for the site's agent (the site's previous one is revoked: rotation). Its token is shown on
    this answer only, never stored in clear, put in a message or sent again; the page is not cached."""
    site, pilot = get_for_user(request, Site.objects.select_related("pilot__customer", "pilot__vendor"), code, "pilot")
    access.require_act(pilot, request.user, Act.OPERATE_NODES)
    with transaction.atomic():
        agent, token = create_agent(site, created_by=request.user)
        lifecycle.audit(pilot, request.user, AuditAction.SITE_AGENT_CREATED, site, name=site.name,
                        token_prefix=agent.token_prefix)
    url = portal_address(request)
    response = render(request, "runners/site_agent.html", {
        "pilot": pilot, "site": site, "agent": agent, "url": url, "https": url.startswith("https://"),
        "loopback": _loopback(url), "packages": agent_packages(), "state": default_state(site),
        "unit": agent_unit(site), "commands": agent_commands(site), "url_from_setting": bool(os.environ.get("SITE_URL")),
        "environment": agent_env(agent, token, url=url, state=default_state(site))})
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def site_agent_revoke(request: HttpRequest, code: UUID) -> HttpResponse:
    site, pilot = get_for_user(request, Site.objects.select_related("pilot__customer", "pilot__vendor"), code, "pilot")
    access.require_act(pilot, request.user, Act.OPERATE_NODES)
    with transaction.atomic():
        count = revoke_agents(site)
        if count:
            lifecycle.audit(pilot, request.user, AuditAction.SITE_AGENT_REVOKED, site, name=site.name)
    if count:
        messages.success(request, _("The agent credential of site %(name)s is revoked: its agent is refused from now "
                                    "on, and the site's nodes cannot be reached until a new agent is enrolled.")
                         % {"name": site.name})
    else:
        messages.info(request, _("Site %(name)s has no active agent credential.") % {"name": site.name})
    return redirect("sites", pilot.code)


def portal_address(request: HttpRequest) -> str:
    """The address the agent must dial: SITE_URL when the deployment sets it, else the address this request reached
    the portal at (never SITE_URL's built-in default, which names no real portal)."""
    if os.environ.get("SITE_URL"):
        return control_plane_url()
    return request.build_absolute_uri("/").rstrip("/")


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


AGENT_PACKAGES = ("paramiko", "cryptography", "PyNaCl")
"""What the site agent imports besides the standard library and fxpilot's `runners` (runners/agent/__init__.py)."""


def agent_packages() -> list[str]:
    """The agent's packages pinned as requirements.txt pins them (`name==version`), or bare names if it is absent."""
    pins = {}
    try:
        for line in (Path(settings.BASE_DIR) / "requirements.txt").read_text().splitlines():
            name, _sep, version = line.split("#")[0].strip().partition("==")
            if version:
                pins[name.lower()] = f"{name}=={version}"
    except OSError:
        pass
    return [pins.get(name.lower(), name) for name in AGENT_PACKAGES]


def agent_files() -> list[str]:
    """The agent's own code: runners/agent/ and every module of `runners` it imports, followed import by import
    (Django-free by design, runners/agent/__init__.py): all the kit carries of fxpilot."""
    base = Path(settings.BASE_DIR)
    todo = ["runners/__init__.py", *sorted(str(p.relative_to(base)) for p in (base / "runners" / "agent").glob("*.py"))]
    seen: list[str] = []
    while todo:
        name = todo.pop(0)
        if name in seen or not (base / name).is_file():
            continue
        seen.append(name)
        for node in ast.walk(ast.parse((base / name).read_text())):
            modules = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            for module in modules:
                if module == "runners" or module.startswith("runners."):
                    path = module.replace(".", "/")
                    todo += [f"{path}.py", f"{path}/__init__.py"]
    return sorted(seen)


KIT_ROOT = "/opt/fxpilot-agent"
KIT_ENV = "/etc/fxpilot-agent.env"


def agent_unit(site: Site) -> str:
    """A systemd unit for the agent of `site`, as the kit ships it."""
    return (f"[Unit]\nDescription=fxpilot site agent of site {site.name} (queue {site.queue})\n"
            "Wants=network-online.target\nAfter=network-online.target\n\n"
            f"[Service]\nUser=fxpilot-agent\nEnvironmentFile={KIT_ENV}\nWorkingDirectory={KIT_ROOT}/src\n"
            f"ExecStart={KIT_ROOT}/venv/bin/python -m runners.agent\nRestart=always\nRestartSec=5\n"
            "KillSignal=SIGTERM\nTimeoutStopSec=60\n\n[Install]\nWantedBy=multi-user.target\n")


def agent_commands(site: Site) -> str:
    """The exact commands that install and start the kit on the jump host (as root), in order."""
    state = default_state(site)
    return "\n".join([
        "# on the site's jump host, as root, in the folder where fxpilot-agent-kit.tar.gz was unpacked",
        "useradd --system --no-create-home --shell /usr/sbin/nologin fxpilot-agent",
        f"install -d -m 0700 -o fxpilot-agent {shlex.quote(state.rsplit('/', 1)[0])}",
        f"python3 -m venv {KIT_ROOT}/venv",
        f"{KIT_ROOT}/venv/bin/pip install -r requirements-agent.txt",
        f"mkdir -p {KIT_ROOT}/src && cp -r runners {KIT_ROOT}/src/",
        f"install -m 0600 -o fxpilot-agent agent.env {KIT_ENV}   # the lines shown once on the portal",
        f"sudo -u fxpilot-agent sh -c 'set -a; . {KIT_ENV}; set +a; cd {KIT_ROOT}/src && "
        f"{KIT_ROOT}/venv/bin/python -m runners.agent --check'",
        "install -m 0644 fxpilot-agent.service /etc/systemd/system/fxpilot-agent.service",
        "systemctl daemon-reload && systemctl enable --now fxpilot-agent",
    ]) + "\n"


@login_required
def site_agent_kit(request: HttpRequest, code: UUID) -> HttpResponse:
    """The agent kit of a site, as a .tar.gz: the agent's code, its pinned requirements, a systemd unit, the
    commands, and an environment file with every line but the token (shown once, when the agent is enrolled)."""
    site, pilot = get_for_user(request, Site.objects.select_related("pilot__customer", "pilot__vendor"), code, "pilot")
    access.require_act(pilot, request.user, Act.OPERATE_NODES)
    url = portal_address(request)
    files = {
        "requirements-agent.txt": "\n".join(agent_packages()) + "\n",
        "fxpilot-agent.service": agent_unit(site),
        "INSTALL.sh": "#!/bin/sh\nset -e\n" + agent_commands(site),
        "agent.env.example": (f"FXPILOT_AGENT_URL={shlex.quote(url)}\n"
                              "FXPILOT_AGENT_TOKEN=   # shown once on the portal when the agent is enrolled\n"
                              f"FXPILOT_AGENT_STATE={shlex.quote(default_state(site))}\n"),
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(f"fxpilot-agent-kit/{name}")
            info.size, info.mode, info.mtime = len(data), mode, int(timezone.now().timestamp())
            tar.addfile(info, io.BytesIO(data))
        for name, text in files.items():
            add(name, text.encode(), 0o755 if name.endswith(".sh") else 0o644)
        for name in agent_files():
            add(name, (Path(settings.BASE_DIR) / name).read_bytes())
    response = HttpResponse(buffer.getvalue(), content_type="application/gzip")
    response["Content-Disposition"] = 'attachment; filename="fxpilot-agent-kit.tar.gz"'
    return response


def _form_errors(request: HttpRequest, form) -> None:
    for field, errors in form.errors.items():
        label = form.fields[field].label if field in form.fields else ""
        messages.error(request, f"{label}: {' '.join(errors)}" if label else " ".join(errors))


@login_required
@require_POST
def node_create(request: HttpRequest, code: UUID) -> HttpResponse:
    site, pilot = get_for_user(request, Site.objects.select_related("pilot__customer", "pilot__vendor"), code, "pilot")
    access.require_act(pilot, request.user, Act.OPERATE_NODES)
    form = NodeForm(request.POST, site=site, prefix=f"n-{site.code}")
    if form.is_valid():
        node = Node(site=site, **form.cleaned_data)
        try:
            node.full_clean()
        except ValidationError as error:
            for field, errors in error.message_dict.items():
                messages.error(request, f"{field}: {' '.join(errors)}")
            return redirect("sites", pilot.code)
        node.save()
        lifecycle.audit(pilot, request.user, AuditAction.NODE_CREATED, node, name=node.name, host=node.host, port=node.port)
        messages.success(
            request,
            _("Node %(name)s added. Its host key is recorded on first contact and must then be accepted here.")
            % {"name": node.name},
        )
    else:
        _form_errors(request, form)
    return redirect("sites", pilot.code)


@sensitive_post_parameters()
@login_required
@require_POST
def credential_create(request: HttpRequest, code: UUID) -> HttpResponse:
    site, pilot = get_for_user(request, Site.objects.select_related("pilot__customer", "pilot__vendor"), code, "pilot")
    access.require_act(pilot, request.user, Act.OPERATE_NODES)
    form = CredentialForm(request.POST, request.FILES, prefix=f"c-{site.code}")
    if form.is_valid():
        try:
            credential = create_credential(
                site,
                form.cleaned_data["name"],
                form.cleaned_data["private_key"],
                form.cleaned_data["passphrase"],
                created_by=request.user,
            )
        except ValidationError as error:
            messages.error(request, _("Private key: %(error)s") % {"error": " ".join(error.messages)})
        else:
            lifecycle.audit(
                pilot,
                request.user,
                AuditAction.CREDENTIAL_CREATED,
                credential,
                name=credential.name,
                fingerprint=credential.public_fingerprint,
            )
            messages.success(
                request,
                _("Credential %(name)s stored encrypted (%(fingerprint)s).")
                % {"name": credential.name, "fingerprint": credential.public_fingerprint},
            )
    else:
        _form_errors(request, form)
    return redirect("sites", pilot.code)


@login_required
def node_detail(request: HttpRequest, code: UUID) -> HttpResponse:
    node, pilot = get_for_user(
        request,
        Node.objects.select_related(
            "site__pilot__customer", "site__pilot__vendor", "credential", "jump_host", "host_key_accepted_by"
        ),
        code,
        "site__pilot",
    )
    probes = list(Job.objects.filter(pilot=pilot, steps__node=node).distinct().select_related("gate")[:10])
    return render(
        request,
        "runners/node.html",
        {
            "pilot": pilot,
            "node": node,
            "inventory": node.inventory or {},
            "start": start_up(pilot, node),
            "cold_start_factor": COLD_START_FACTOR,
            "cold_start_floor_s": COLD_START_FLOOR_S,
            "health_timeout_max_s": HEALTH_TIMEOUT_MAX_S,
            "probes": probes,
            "can_operate": access.offers(pilot, request.user, Act.OPERATE_NODES, pilot),
            "contact_waits": _contact_waits(node),
        },
    )


CONTACT_WAIT = timedelta(seconds=30)
"""A contact no worker answered within this long is said to wait for a worker serving the site's queue."""


def _contact_waits(node: Node) -> dict | None:
    """A "Contact the node" that nobody has answered for CONTACT_WAIT: the queue it waits on and how to serve it
    (a worker started before the site existed does not serve its queue), else None."""
    if node.contact_state != "waiting" or node.contact_requested_at is None:
        return None
    waited = timezone.now() - node.contact_requested_at
    if waited < CONTACT_WAIT:
        return None
    return {"queue": node.site.queue, "seconds": int(waited.total_seconds())}


@login_required
@require_POST
def node_accept_host_key(request: HttpRequest, code: UUID) -> HttpResponse:
    node, pilot = get_for_user(
        request, Node.objects.select_related("site__pilot__customer", "site__pilot__vendor"), code, "site__pilot"
    )
    access.require_act(pilot, request.user, Act.OPERATE_NODES)
    fingerprint = request.POST.get("fingerprint", "")
    try:
        accepted = accept_host_key(node, fingerprint, user=request.user)
    except ValueError as error:
        messages.error(request, str(error))
    else:
        lifecycle.audit(
            pilot,
            request.user,
            AuditAction.NODE_HOST_KEY_ACCEPTED,
            accepted,
            Node.HostKeyState.PENDING,
            Node.HostKeyState.ACCEPTED,
            fingerprint=fingerprint,
        )
        messages.success(
            request,
            _("Host key %(fingerprint)s of %(node)s accepted.") % {"fingerprint": fingerprint, "node": node.name},
        )
        notifications.sweep([pilot])
    if request.POST.get("back") == "sites":
        return redirect("sites", pilot.code)
    return redirect("node", node.code)


@login_required
@require_POST
def node_contact(request: HttpRequest, code: UUID) -> HttpResponse:
    """Ask the site's worker to connect once (the portal never opens SSH to a node); the node page shows the answer.

    A first contact records the offered host key, which then waits on the node page for acceptance.
    """
    node, pilot = get_for_user(
        request,
        Node.objects.select_related("site__pilot__customer", "site__pilot__vendor", "credential", "site"),
        code,
        "site__pilot",
    )
    access.require_act(pilot, request.user, Act.OPERATE_NODES)
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(contact_state="waiting", contact_message="",
                                               contact_requested_at=timezone.now())
        dispatch_contact(node)
    messages.info(
        request,
        _("The worker of site %(site)s (queue %(queue)s) is contacting %(node)s; its answer appears below.")
        % {"site": node.site.name, "queue": node.site.queue, "node": node.name},
    )
    return redirect("node", node.code)
