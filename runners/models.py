"""What touches a node: sites, nodes, credentials, jobs and their steps, output and artifacts."""
from __future__ import annotations

import uuid
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from gates.models import Gate, Pilot
from runners.sealing import SealError, fingerprint
from runners.validators import validate_site_queue


class Site(models.Model):
    """A customer location. Its jobs go to its own Celery queue, served by a worker that can reach it."""

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    pilot = models.ForeignKey(Pilot, on_delete=models.CASCADE, related_name="sites")
    name = models.CharField(max_length=100)
    queue = models.SlugField(max_length=64, unique=True, help_text="Celery queue served by this site's worker")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["pilot", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.queue})"

    def clean(self) -> None:
        """A site's queue is never one of the control tier's (runners.validators.validate_site_queue)."""
        try:
            validate_site_queue(self.queue)
        except ValidationError as error:
            raise ValidationError({"queue": error.error_list}) from None


class Credential(models.Model):
    """An SSH private key, encrypted at rest per field; never shown back once stored."""

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="credentials")
    name = models.CharField(max_length=100)
    private_key_encrypted = models.TextField(editable=False)
    passphrase_encrypted = models.TextField(blank=True, editable=False)
    public_fingerprint = models.CharField(max_length=100, editable=False, help_text="SHA256 fingerprint of the public half")
    key_type = models.CharField(max_length=32, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(default=timezone.now)
    # A site with an enrolled agent: the key is sealed to that agent's X25519 key (runners.sealing) and the two
    # fields above stay empty; only the agent on the site's jump host can open it, never the control plane.
    sealed_key = models.TextField(blank=True, default="", editable=False)
    sealed_passphrase = models.TextField(blank=True, default="", editable=False)
    sealed_to = models.ForeignKey("SiteAgent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                  editable=False)

    class Meta:
        ordering = ["site", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.key_type} {self.public_fingerprint})"

    @property
    def is_sealed(self) -> bool:
        return bool(self.sealed_key)


class SiteAgent(models.Model):
    """The process on a site's jump host (runners.agent): it reaches the control plane with its own bearer token
    (stored hashed, shown once) and opens the site's SSH keys with its own X25519 key. At most one is active (not
    revoked) per site: enrolling a new one revokes the previous one (rotation)."""

    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="agents")
    token_prefix = models.CharField(max_length=8, editable=False, help_text="The token's first characters, for lists")
    token_hash = models.CharField(max_length=64, unique=True, editable=False, help_text="SHA-256 of the token")
    public_key = models.CharField(max_length=64, blank=True, default="", editable=False,
                                  help_text="Base64url of the agent's X25519 public key, registered by its first hello")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_seen = models.DateTimeField(null=True, blank=True, editable=False)
    last_address = models.CharField(max_length=64, blank=True, default="", editable=False)
    version = models.CharField(max_length=64, blank=True, default="", editable=False)
    started_at = models.DateTimeField(null=True, blank=True, editable=False,
                                      help_text="When the agent's current process said its first hello")

    class Meta:
        ordering = ["site", "-created"]

    def __str__(self) -> str:
        state = "revoked" if self.revoked_at else "active"
        return f"agent {self.token_prefix}… of {self.site.name} ({state})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @property
    def key_fingerprint(self) -> str:
        if not self.public_key:
            return ""
        try:
            return fingerprint(self.public_key)
        except SealError:
            return "?"


def active_agent(site: Site | int | None) -> SiteAgent | None:
    """The site's enrolled agent that has registered its public key, or None (the control plane reaches the
    site's nodes itself then)."""
    if site is None:
        return None
    site_id = site if isinstance(site, int) else site.pk
    return (SiteAgent.objects.filter(site_id=site_id, revoked_at=None).exclude(public_key="")
            .order_by("-created").first())


class Node(models.Model):
    class Role(models.TextChoices):
        GPU = "gpu", _("GPU node")
        JUMP = "jump", _("Jump host")

    class HostKeyState(models.TextChoices):
        UNKNOWN = "unknown", _("Never contacted")
        PENDING = "pending", _("Seen — waiting for an engineer to accept it")
        ACCEPTED = "accepted", _("Accepted")

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=100)
    host = models.CharField(max_length=253)
    port = models.PositiveIntegerField(default=22)
    username = models.CharField(max_length=32)
    role = models.CharField(max_length=8, choices=Role.choices, default=Role.GPU)
    credential = models.ForeignKey(Credential, null=True, blank=True, on_delete=models.PROTECT, related_name="nodes")
    jump_host = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    simulated = models.BooleanField(default=False, help_text="A simulated GPU node (manage.py simnode)")
    # Host key pinning: the accepted key, and the key seen on first contact while it waits for acceptance.
    host_key_state = models.CharField(max_length=10, choices=HostKeyState.choices, default=HostKeyState.UNKNOWN, editable=False)
    host_key_type = models.CharField(max_length=32, blank=True, editable=False)
    host_key = models.TextField(blank=True, editable=False, help_text="Base64 of the accepted public host key")
    host_key_fingerprint = models.CharField(max_length=100, blank=True, editable=False)
    pending_host_key_type = models.CharField(max_length=32, blank=True, editable=False)
    pending_host_key = models.TextField(blank=True, editable=False)
    pending_host_key_fingerprint = models.CharField(max_length=100, blank=True, editable=False)
    host_key_accepted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    host_key_accepted_label = models.CharField(max_length=150, blank=True, editable=False,
                                               help_text="Who accepted it when no signed-in person did, e.g. the command line (user@host)")
    host_key_accepted_at = models.DateTimeField(null=True, blank=True, editable=False)
    # "Contact the node": done by the site's worker (the portal never opens SSH to a node); its answer lands here.
    contact_state = models.CharField(max_length=12, blank=True, default="", editable=False,
                                     help_text="waiting, ok, pending-key or error")
    contact_message = models.TextField(blank=True, default="", editable=False)
    contact_requested_at = models.DateTimeField(null=True, blank=True, editable=False)
    contacted_at = models.DateTimeField(null=True, blank=True, editable=False)
    inventory = models.JSONField(default=dict, blank=True, editable=False, help_text="Parsed from the last probe")
    inventory_at = models.DateTimeField(null=True, blank=True, editable=False)
    # G1's measured cold start of the planned model (deploy.sh's record: seconds, caches "empty", measured_at, model,
    # tensor_parallel_size, simulated, time_scale) and the run that measured it; later deploys' /health waits follow
    # from it (runners.config.health_timeout).
    cold_start = models.JSONField(default=dict, blank=True, editable=False,
                                  help_text="G1's measured cold start of the planned model (compile caches empty)")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["site", "name"]
        constraints = [models.UniqueConstraint(fields=["site", "name"], name="unique_node_name_per_site")]

    def __str__(self) -> str:
        return f"{self.name} ({self.username}@{self.host}:{self.port})"


class Status(models.TextChoices):
    """One status list for every job and step (AWX): failed = ran and missed a bar; error = could not run."""

    PENDING = "pending", _("Pending")
    RUNNING = "running", _("Running")
    SUCCESSFUL = "successful", _("Successful")
    FAILED = "failed", _("Failed")
    ERROR = "error", _("Error")
    CANCELED = "canceled", _("Canceled")


FINISHED = (Status.SUCCESSFUL, Status.FAILED, Status.ERROR, Status.CANCELED)
UNFINISHED = (Status.PENDING, Status.RUNNING)


class PilotScopedQuerySet(models.QuerySet):
    """`for_user(user, may=RAW_DATA)`: the rows of the pilots where the person holds one of the roles in `may`
    (portal.access holds the policy); `pilot_path` is the lookup from the row to its pilot."""

    pilot_path = "pilot"

    def for_user(self, user, may=None):
        return self.filter(**{f"{self.pilot_path}__in": Pilot.objects.for_user(user, may=may)})


class JobQuerySet(PilotScopedQuerySet):
    pilot_path = "pilot"


class ArtifactQuerySet(PilotScopedQuerySet):
    pilot_path = "job__pilot"


class Job(models.Model):
    """Anything dispatched to nodes: a gate run (gate set) or a standalone probe."""

    objects = JobQuerySet.as_manager()

    class Kind(models.TextChoices):
        GATE_RUN = "gate_run", _("Gate run")
        PROBE = "probe", _("Probe")

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    pilot = models.ForeignKey(Pilot, on_delete=models.CASCADE, related_name="jobs")
    gate = models.ForeignKey(Gate, null=True, blank=True, on_delete=models.CASCADE, related_name="jobs")
    site = models.ForeignKey(Site, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.GATE_RUN)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING, editable=False)
    params = models.JSONField(default=dict, blank=True, help_text="Time scale, repetitions, workload overrides")
    error = models.TextField(blank=True, help_text="What broke, when status is error")
    cancel_requested = models.BooleanField(default=False)
    # A run started while another run holds one of its machines waits (pending, nothing dispatched) until
    # that run gives them back; then the engine takes them and starts it. Blank once it holds its nodes.
    waiting_for = models.CharField(max_length=400, blank=True, default="", editable=False,
                                   help_text="why the run has not started: the node and the run holding it")
    waiting_on = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="waiters",
                                   editable=False)
    chunk_count = models.PositiveIntegerField(default=0, editable=False, help_text="Output chunks numbered so far")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by_label = models.CharField(max_length=150, blank=True, editable=False,
                                        help_text="Who started it when no signed-in person did, e.g. the command line (user@host)")
    created = models.DateTimeField(default=timezone.now)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        what = self.gate.label if self.gate_id else self.get_kind_display()
        return f"{what} run {str(self.code)[:8]} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED


class Step(models.Model):
    """One unit of a job, claimed by a conditional update so that two workers never run it twice."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="steps")
    seq = models.PositiveIntegerField(help_text="Order within the job")
    name = models.CharField(max_length=32)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.PROTECT, related_name="steps")
    arm = models.CharField(max_length=32, blank=True)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    claimed_by = models.CharField(max_length=200, blank=True)
    heartbeat = models.DateTimeField(null=True, blank=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    # Remote process of a detached command: {"dir": ..., "pid": ..., "pgid": ...}
    remote = models.JSONField(default=dict, blank=True)
    requests_done = models.PositiveIntegerField(default=0)
    requests_total = models.PositiveIntegerField(default=0)
    params = models.JSONField(default=dict, blank=True)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="unique_step_seq")]

    def __str__(self) -> str:
        where = f" on {self.node.name}" if self.node_id else ""
        arm = f" [{self.arm}]" if self.arm else ""
        return f"{self.seq}. {self.name}{arm}{where} ({self.status})"


class OutputChunk(models.Model):
    """Output as it arrives, numbered per job without gaps so a live page can back-fill."""

    class Stream(models.TextChoices):
        STDOUT = "stdout", "stdout"
        STDERR = "stderr", "stderr"
        SYSTEM = "system", "system"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="chunks")
    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.CASCADE, related_name="chunks")
    seq = models.PositiveIntegerField()
    stream = models.CharField(max_length=8, choices=Stream.choices)
    text = models.TextField()
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="unique_chunk_seq")]


class Artifact(models.Model):
    """A raw file kept as evidence, content-addressed by SHA-256 under DATA_DIR/artifacts."""

    objects = ArtifactQuerySet.as_manager()

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="artifacts")
    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.SET_NULL, related_name="artifacts")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="artifacts")
    name = models.CharField(max_length=200, help_text="e.g. node1/probe/amd-smi.json")
    kind = models.CharField(max_length=32, help_text="probe, records, server-log, config, manifest, ...")
    sha256 = models.CharField(max_length=64, db_index=True)
    size = models.BigIntegerField()
    simulated = models.BooleanField(default=False)
    # Blank when a step collected it on its way to success; "error" or "canceled" when teardown kept what the
    # node had recorded after the run (or the step) ended so — evidence of what happened, never judged.
    outcome = models.CharField(max_length=12, blank=True, default="")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "name"]
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="unique_artifact_name_per_job")]

    def __str__(self) -> str:
        return f"{self.name} ({self.sha256[:12]})"

    @property
    def storage_name(self) -> str:
        return artifact_storage_name(self.sha256)

    @property
    def path(self) -> Path:
        """The local file, with the embedded file-system storage only (object storage has no path)."""
        return artifact_path(self.sha256)


def artifact_storage_name(sha256: str) -> str:
    """The artifact's key in the evidence storage (a file under DATA_DIR, or an object in the bucket)."""
    return f"artifacts/{sha256[:2]}/{sha256}"


def artifact_path(sha256: str) -> Path:
    return Path(settings.DATA_DIR) / artifact_storage_name(sha256)


class LeaseRefused(Exception):
    """A node is held by another unfinished run; the message names that run (`holder`) and the node."""

    def __init__(self, message: str, *, holder: Job | None = None, node: Node | None = None,
                 for_job: Job | None = None) -> None:
        self.holder, self.node, self.for_job = holder, node, for_job
        super().__init__(message)

    @property
    def waiting(self) -> str:
        """The line a waiting run shows: which node, held by which run (another pilot's run is not named)."""
        if self.holder is None or self.node is None:
            return f"waiting for its nodes: {self}"
        return (f"waiting for node {self.node.name} ({self.node.host}:{self.node.port}) held by "
                f"{describe_holder(self.holder, self.for_job)}; it starts by itself once that run has finished")


class NodeLease(models.Model):
    """A machine belongs to one run at a time: its GPUs, its server ports and its FX attachment.

    Keyed by what identifies the machine, not the Node row: two pilots that registered the same machine
    (each its own Node) still meet here. A node has one lease row per key (its address, and its accepted
    host key when there is one), all taken when a run is created, or none; released when the run finishes.
    A lease whose run has finished is free, so a run that ended without releasing never blocks a machine.
    """

    resource = models.CharField(max_length=400, unique=True, help_text="address or host key of the machine")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="leases")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="leases")
    taken = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.resource} held by {self.job}"


def lease_keys(node: Node) -> list[str]:
    """What identifies the machine behind a Node: where it is reached, and its pinned host key."""
    via = ""
    if node.jump_host_id:
        jump = node.jump_host
        via = f"{jump.host.lower()}:{jump.port}>"
    keys = [f"address:{via}{node.host.lower()}:{node.port}"]
    if node.host_key_state == Node.HostKeyState.ACCEPTED and node.host_key_fingerprint:
        keys.append(f"host-key:{node.host_key_fingerprint}")
    return keys


def describe_holder(job: Job, for_job: Job | None = None) -> str:
    """The run holding a machine, as told to `for_job`'s people. It is named only when everyone who may read
    `for_job` may read it too (both pilots have the same customer and the same vendor); otherwise it is "a run
    of another pilot", never its pilot's name, gate or code."""
    if for_job is not None and not same_parties(job, for_job):
        return "a run of another pilot"
    what = f"{job.gate.label} run" if job.gate_id else job.kind.replace("_", " ")  # log lines are English
    return f"{what} {str(job.code)[:8]} of pilot {job.pilot.name} ({job.status})"


def same_parties(job: Job, other: Job) -> bool:
    """Whether the two runs' pilots have the same customer and vendor (access is by organisation)."""
    a, b = job.pilot, other.pilot
    return a.customer_id == b.customer_id and a.vendor_id == b.vendor_id


def take_nodes(job: Job, nodes) -> list[NodeLease]:
    """Lease every node to `job`, or raise LeaseRefused naming the run that holds one (nothing is taken then)."""
    from django.db import IntegrityError, transaction

    leases = []
    with transaction.atomic():
        for node in sorted(nodes, key=lambda n: n.pk):
            for key in lease_keys(node):
                held = NodeLease.objects.select_for_update(of=("self",)).select_related("job__gate", "job__pilot").filter(
                    resource=key).first()
                if held is not None and held.job_id == job.pk:
                    leases.append(held)
                    continue
                if held is not None:
                    if held.job.status not in FINISHED:
                        raise LeaseRefused(f"node {node.name} ({node.host}:{node.port}) is in use by "
                                           f"{describe_holder(held.job, job)}; start this run once that one has "
                                           "finished or been canceled", holder=held.job, node=node, for_job=job)
                    held.delete()  # its run finished without giving it back
                try:
                    with transaction.atomic():
                        leases.append(NodeLease.objects.create(resource=key, node=node, job=job))
                except IntegrityError:
                    raise LeaseRefused(f"node {node.name} ({node.host}:{node.port}) is being taken by another run "
                                       "right now; try again once it has finished", node=node) from None
    return leases


def release_nodes(job: Job) -> int:
    """Give back every node `job` holds (idempotent)."""
    return NodeLease.objects.filter(job=job).delete()[0]


def job_nodes(job: Job) -> list[Node]:
    """The machines a run's steps use: what it must hold before any of them runs."""
    return list(Node.objects.filter(pk__in=job.steps.exclude(node=None).values("node")).order_by("pk"))


def lease_holder(node: Node) -> Job | None:
    """The unfinished run that holds the machine behind `node`, if any."""
    for lease in NodeLease.objects.select_related("job").filter(resource__in=lease_keys(node)):
        if lease.job.status not in FINISHED:
            return lease.job
    return None


class AgentCall(models.Model):
    """A work unit for a site agent: run a command, write a file, read a file or open a connection on one node.

    The control plane (runners.agentlink) queues it and waits on the row; the agent takes it by a conditional
    update (queued → taken), streams its output, and marks it done (runners.agentapi). A waiter that gives up
    marks it expired, so a late answer is refused."""

    class Op(models.TextChoices):
        RUN = "run", "run"
        PUT = "put", "put"
        GET = "get", "get"
        CONTACT = "contact", "contact"

    class State(models.TextChoices):
        QUEUED = "queued", _("Queued")
        TAKEN = "taken", _("Taken")
        DONE = "done", _("Done")
        CANCELED = "canceled", _("Canceled")
        EXPIRED = "expired", _("Expired")

    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="agent_calls")
    agent = models.ForeignKey(SiteAgent, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="agent_calls")
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.CASCADE, related_name="agent_calls")
    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.CASCADE, related_name="agent_calls")
    op = models.CharField(max_length=8, choices=Op.choices)
    request = models.JSONField(default=dict, blank=True)
    payload = models.BinaryField(null=True, blank=True)
    state = models.CharField(max_length=8, choices=State.choices, default=State.QUEUED)
    result = models.JSONField(default=dict, blank=True)
    stdout_tail = models.TextField(blank=True, default="")
    stderr_tail = models.TextField(blank=True, default="")
    # Output received but not yet written to the job's log (an unfinished line, a split UTF-8 character) and
    # whether a tail was cut: {"stdout": base64, "stderr": base64, "truncated": [streams]}.
    output_state = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(default=timezone.now)
    taken_at = models.DateTimeField(null=True, blank=True)
    touched = models.DateTimeField(null=True, blank=True, help_text="The agent's last sign of life on this call")
    finished = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(help_text="Queued: to be taken by then; taken: no answer is wanted after it")

    class Meta:
        ordering = ["created", "pk"]
        indexes = [models.Index(fields=["site", "state"], name="agentcall_site_state")]

    def __str__(self) -> str:
        return f"{self.op} call {self.pk} on {self.node.name} ({self.state})"
