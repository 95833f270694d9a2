"""The portal's forms. Every choice of a related object is scoped to the pilot being edited.

Pilots, plans, gates and reports first; then what touches a node: sites, nodes and SSH credentials."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import Prefetch
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from gates.lifecycle import people_of
from gates.models import Criterion, Membership, Organisation, Pilot, Role, SignOff
from gates.plan import PLANS_DIR, threshold_range
from reports.units import UNIT_WORDS
from runners.credentials import MAX_KEY_BYTES
from runners.models import Credential, Node, Site
from runners.validators import validate_host, validate_port, validate_site_queue, validate_username

OPERATORS = [(">=", "≥"), ("<=", "≤"), (">", ">"), ("<", "<"), ("==", "=")]


# What a threshold out of its range is told, by the range's kind (gates.plan.threshold_range); %(field)s names the
# field, %(value)s is what was typed.
RANGE_ERRORS = {
    "ratio": _("%(field)s is a share: from 0 %% to 100 %%, not %(value)s."),
    "change": _("%(field)s is a change: −100 %% or more, not %(value)s."),
    "change-reduction": _("%(field)s is a reduction: from −100 %% to 100 %%, not %(value)s."),
    "spread": _("%(field)s is a spread: 0 %% or more, not %(value)s."),
    "speedup": _("%(field)s is a speed-up: more than 0×, not %(value)s."),
    "count": _("%(field)s is a count: a whole number, 0 or more, not %(value)s."),
    "amount": _("%(field)s must be 0 or more, not %(value)s."),
}


def _percent(value: float) -> float:
    return round(value * 100, 10)


def _fraction(value: float) -> float:
    return round(value / 100, 12)


class CriterionForm(forms.Form):
    """What may change in a draft plan: the bar, not what is measured.

    Figures are entered in the unit the page shows them in: a fraction (a share, a change, a spread) and the
    confidence level in percent, stored as the fraction the plan file holds (docs/plan-format.md); a speed-up in ×,
    a count as a whole number. Each is checked against its range (gates.plan.threshold_range), the error naming the
    field."""

    op = forms.ChoiceField(label=_("Operator"), choices=OPERATORS)
    threshold = forms.FloatField(label=_("Threshold"))
    concurrency = forms.CharField(
        label=_("Concurrency levels"),
        required=False,
        max_length=100,
        help_text=_("Comma-separated, e.g. 8, 16, 32; empty for none"),
    )
    confidence = forms.FloatField(label=_("Confidence level (%)"))

    def __init__(self, *args, criterion: Criterion | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.range = threshold_range(criterion.metric, criterion.statistic, criterion.comparison, criterion.unit) \
            if criterion is not None else None
        self.reduction = criterion is not None and criterion.comparison == "reduction"
        if self.range is not None:
            unit = "%" if self.range.percent else ("×" if self.range.kind == "speedup" else criterion.unit)
            if unit and unit != "fraction":
                self.fields["threshold"].label = _("Threshold (%(unit)s)") % {"unit": UNIT_WORDS.get(unit, unit)}

    @classmethod
    def for_criterion(cls, criterion: Criterion, data=None) -> CriterionForm:
        shown = threshold_range(criterion.metric, criterion.statistic, criterion.comparison, criterion.unit)
        initial = {
            "op": criterion.op,
            "threshold": _percent(criterion.threshold) if shown.percent else criterion.threshold,
            "confidence": _percent(criterion.confidence),
            "concurrency": ", ".join(str(level) for level in criterion.concurrency or []),
        }
        return cls(data=data, initial=initial, prefix=criterion.key, criterion=criterion)

    def _typed(self, name: str) -> str:
        return str(self.data.get(self.add_prefix(name), "")).strip()

    def clean_threshold(self) -> float:
        value = self.cleaned_data["threshold"]
        label = self.fields["threshold"].label
        if value != value or value in (float("inf"), float("-inf")):
            raise ValidationError(_("%(field)s must be a finite number.") % {"field": label})
        if self.range is None:
            return value
        stored = _fraction(value) if self.range.percent else value
        kind = self.range.problem(stored)
        if kind:
            kind = "change-reduction" if kind == "change" and self.reduction else kind
            shown = self._typed("threshold") + (" %" if self.range.percent else "")
            raise ValidationError(RANGE_ERRORS[kind] % {"field": label, "value": shown})
        return stored

    def clean_confidence(self) -> float:
        value = self.cleaned_data["confidence"]
        if not 50 <= value <= 99.9:
            raise ValidationError(_("%(field)s is from 50 %% to 99.9 %%, not %(value)s.")
                                  % {"field": self.fields["confidence"].label, "value": f"{self._typed('confidence')} %"})
        return _fraction(value)

    def clean_concurrency(self) -> list[int]:
        text = self.cleaned_data["concurrency"].strip()
        if not text:
            return []
        levels = []
        for part in text.replace(";", ",").split(","):
            part = part.strip()
            if not part.isdigit() or not 1 <= int(part) <= 4096:
                raise ValidationError(
                    _("“%(part)s” is not a concurrency level (a whole number from 1 to 4096)."), params={"part": part}
                )
            levels.append(int(part))
        return sorted(set(levels))

    def changes(self, criterion: Criterion) -> dict:
        """Only the fields whose value differs, so the audit log records real changes."""
        return {name: value for name, value in self.cleaned_data.items() if getattr(criterion, name) != value}


class PlanSignForm(forms.Form):
    comment = forms.CharField(
        label=_("Comment"), required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2})
    )


class GateSignOffForm(forms.Form):
    decision = forms.ChoiceField(label=_("Decision"), choices=SignOff.Decision.choices, widget=forms.RadioSelect)
    comment = forms.CharField(
        label=_("Comment"),
        required=False,
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text=_("Required when you reject: say what is missing."),
    )

    def clean(self) -> dict:
        data = super().clean()
        if data.get("decision") == SignOff.Decision.REJECT and not data.get("comment", "").strip():
            self.add_error("comment", _("A rejection must say why."))
        return data


class TraceUploadForm(forms.Form):
    trace = forms.FileField(label=_("The customer's session trace (CSV)"),
                            help_text=_("Columns session_id, turn, prompt_tokens, output_tokens, arrival_offset_s."))


def max_report_bytes() -> int:
    """The project's upload limit (FXPILOT_UPLOAD_MAX_BYTES, 25 MB by default) bounds a PDF to verify."""
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


class PdfUploadForm(forms.Form):
    file = forms.FileField(label=_("Signed PDF report"))

    def clean_file(self):
        upload = self.cleaned_data["file"]
        limit = max_report_bytes()
        if upload.size > limit:
            raise ValidationError(
                _("The file is %(size)s MB, larger than the upload limit of %(limit)s MB (FXPILOT_UPLOAD_MAX_BYTES)."),
                params={"size": f"{upload.size / 2**20:.1f}", "limit": f"{limit / 2**20:g}"},
            )
        head = upload.read(5)
        upload.seek(0)
        if head != b"%PDF-":
            raise ValidationError(_("This file is not a PDF (it does not start with %%PDF-)."))
        return upload


def plan_templates() -> list[tuple[str, str]]:
    """The plan templates a new pilot may start from: gates/plans/*.yaml, by name."""
    return [(path.stem, path.stem) for path in sorted(PLANS_DIR.glob("*.yaml"))]


class PeopleField(forms.ModelMultipleChoiceField):
    """People offered by name and organisation — "Bob Wang (bob) — Example Cloud" — never by a bare user name.

    The queryset carries each person's memberships of the organisations offered as `offered_memberships`."""

    def label_from_instance(self, person) -> str:
        name = person.get_full_name()
        who = f"{name} ({person.get_username()})" if name else person.get_username()
        organisations = sorted({m.organisation.name for m in getattr(person, "offered_memberships", [])})
        return f"{who} — {', '.join(organisations)}" if organisations else who


def people_field(label) -> PeopleField:
    return PeopleField(label=label, required=False, queryset=get_user_model().objects.none(), error_messages={
        "invalid_choice": _("“%(value)s” is not one of the people offered here: only people of the chosen customer "
                            "may hold its roles.")})


class NewPilotForm(forms.Form):
    """A vendor lead's new pilot: its customer, plan template, start date and the customer's people.

    Only customer organisations that have no pilot with another vendor are offered, and only people of those
    customers, by name and organisation, so the form shows nothing of other vendors. A customer role goes to
    a person of the chosen customer only (gates.lifecycle.role_organisation): anyone else is refused, naming
    the field (`PERSON_FIELDS`: every field of the portal's forms that names a person, with its role).
    """

    PERSON_FIELDS = {"customer_engineers": Role.CUSTOMER_ENGINEER, "customer_approvers": Role.CUSTOMER_APPROVER}

    name = forms.CharField(label=_("Pilot name"), max_length=200)
    customer = forms.ModelChoiceField(label=_("Customer organisation"), queryset=Organisation.objects.none())
    plan = forms.ChoiceField(label=_("Plan template"), choices=())
    start_date = forms.DateField(label=_("Start date"), widget=forms.DateInput(attrs={"type": "date"}))
    customer_engineers = people_field(_("Customer engineers"))
    customer_approvers = people_field(_("Customer approvers"))

    def __init__(self, vendor: Organisation, *args, **kwargs):
        super().__init__(*args, **kwargs)
        customers = (Organisation.objects.filter(kind=Organisation.Kind.CUSTOMER)
                     .exclude(customer_pilots__in=Pilot.objects.exclude(vendor=vendor))
                     .order_by("name"))
        self.fields["customer"].queryset = customers
        memberships = Membership.objects.filter(organisation__in=customers).select_related("organisation")
        people = (get_user_model().objects.filter(is_active=True, memberships__organisation__in=customers)
                  .distinct().order_by("first_name", "last_name", "username")
                  .prefetch_related(Prefetch("memberships", queryset=memberships, to_attr="offered_memberships")))
        grouped = None
        for field_name in self.PERSON_FIELDS:
            self.fields[field_name].queryset = people
            grouped = grouped or self._by_organisation(self.fields[field_name])
            self.fields[field_name].widget.choices = grouped
        self.fields["plan"].choices = plan_templates()
        self.fields["start_date"].initial = timezone.localdate()

    @staticmethod
    def _by_organisation(field: PeopleField) -> list:
        """The people offered, grouped by their organisation (a group per customer), each by name and organisation."""
        groups: dict[str, list] = {}
        for person in field.queryset:
            for organisation in sorted({m.organisation.name for m in person.offered_memberships}):
                groups.setdefault(organisation, []).append((person.pk, field.label_from_instance(person)))
        return sorted(groups.items())

    def clean(self) -> dict:
        data = super().clean()
        customer = data.get("customer")
        if customer is None:
            return data
        own = set(people_of(customer).values_list("pk", flat=True))
        for field_name in self.PERSON_FIELDS:
            strangers = [person for person in data.get(field_name) or [] if person.pk not in own]
            if strangers:
                self.add_error(field_name, ValidationError(
                    _("Not a person of %(customer)s: %(people)s. Only the customer's own people may hold its roles."),
                    code="organisation", params={"customer": customer.name, "people": ", ".join(
                        f"{p.get_full_name() or p.get_username()} ({p.get_username()})" for p in strangers)}))
        return data


# ── Sites, nodes and SSH credentials ───────────────────────────────────────────────────────────


class SiteForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=100)
    queue = forms.SlugField(
        label=_("Celery queue"),
        max_length=64,
        help_text=_("Letters, digits, - and _; served by the worker that can reach this site"),
    )

    def clean_queue(self) -> str:
        queue = validate_site_queue(self.cleaned_data["queue"])
        if Site.objects.filter(queue=queue).exists():
            raise ValidationError(_("The queue “%(queue)s” is already used by another site."), params={"queue": queue})
        return queue


class NodeForm(forms.Form):
    name = forms.SlugField(label=_("Name"), max_length=100)
    host = forms.CharField(label=_("Host"), max_length=253, help_text=_("IP address or host name"))
    port = forms.IntegerField(label=_("SSH port"), initial=22, min_value=1, max_value=65535)
    username = forms.CharField(label=_("User name"), max_length=32)
    role = forms.ChoiceField(label=_("Role"))
    credential = forms.ModelChoiceField(label=_("Credential"), queryset=None, required=False)
    jump_host = forms.ModelChoiceField(label=_("Jump host"), queryset=None, required=False)

    def __init__(self, *args, site, **kwargs):
        super().__init__(*args, **kwargs)
        self.site = site
        self.fields["role"].choices = Node.Role.choices
        self.fields["credential"].queryset = Credential.objects.filter(site=site)
        self.fields["jump_host"].queryset = Node.objects.filter(site=site, role=Node.Role.JUMP)

    def clean_host(self) -> str:
        return validate_host(self.cleaned_data["host"].strip())

    def clean_port(self) -> int:
        return validate_port(self.cleaned_data["port"])

    def clean_username(self) -> str:
        return validate_username(self.cleaned_data["username"].strip())

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        if Node.objects.filter(site=self.site, name=name).exists():
            raise ValidationError(_("This site already has a node named “%(name)s”."), params={"name": name})
        return name


class CredentialForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=100)
    private_key = forms.CharField(
        label=_("Private key"),
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 6, "autocomplete": "off", "spellcheck": "false"}),
        help_text=_("OpenSSH or PEM; it is stored encrypted and never shown again"),
    )
    key_file = forms.FileField(label=_("…or a key file"), required=False)
    passphrase = forms.CharField(
        label=_("Passphrase"),
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
    )

    def clean(self) -> dict:
        data = super().clean()
        upload = data.get("key_file")
        if upload is not None:
            if upload.size > MAX_KEY_BYTES:
                self.add_error("key_file", _("This file is too large to be an SSH private key."))
                return data
            data["private_key"] = upload.read().decode("utf-8", errors="replace")
        if not data.get("private_key", "").strip():
            self.add_error("private_key", _("Paste the private key or choose its file."))
        return data
