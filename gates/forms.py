"""The portal's forms. Every choice of a related object is scoped to the pilot being edited."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.utils.translation import gettext_lazy as _

from gates.models import Criterion, SignOff

try:
    from runners.validators import validate_host, validate_port, validate_username
except ImportError:  # the SSH engineer's validators; the model fields still bound what is stored
    validate_host = validate_port = validate_username = None

OPERATORS = [(">=", "≥"), ("<=", "≤"), (">", ">"), ("<", "<"), ("==", "=")]
MAX_REPORT_BYTES = 100 * 1024 * 1024
MAX_KEY_BYTES = 64 * 1024


class CriterionForm(forms.Form):
    """What may change in a draft plan: the bar, not what is measured."""

    op = forms.ChoiceField(label=_("Operator"), choices=OPERATORS)
    threshold = forms.FloatField(label=_("Threshold"))
    concurrency = forms.CharField(
        label=_("Concurrency levels"),
        required=False,
        max_length=100,
        help_text=_("Comma-separated, e.g. 8, 16, 32; empty for none"),
    )
    confidence = forms.FloatField(
        label=_("Confidence level"), validators=[MinValueValidator(0.5), MaxValueValidator(0.999)]
    )

    @classmethod
    def for_criterion(cls, criterion: Criterion, data=None) -> CriterionForm:
        initial = {
            "op": criterion.op,
            "threshold": criterion.threshold,
            "confidence": criterion.confidence,
            "concurrency": ", ".join(str(level) for level in criterion.concurrency or []),
        }
        return cls(data=data, initial=initial, prefix=criterion.key)

    def clean_threshold(self) -> float:
        value = self.cleaned_data["threshold"]
        if value != value or value in (float("inf"), float("-inf")):
            raise ValidationError(_("The threshold must be a finite number."))
        return value

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


class PdfUploadForm(forms.Form):
    file = forms.FileField(label=_("Signed PDF report"))

    def clean_file(self):
        upload = self.cleaned_data["file"]
        if upload.size > MAX_REPORT_BYTES:
            raise ValidationError(
                _("The file is larger than %(limit)s MB."), params={"limit": MAX_REPORT_BYTES // 2**20}
            )
        head = upload.read(5)
        upload.seek(0)
        if head != b"%PDF-":
            raise ValidationError(_("This file is not a PDF (it does not start with %%PDF-)."))
        return upload


class SiteForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=100)
    queue = forms.SlugField(
        label=_("Celery queue"),
        max_length=64,
        help_text=_("Letters, digits, - and _; served by the worker that can reach this site"),
    )

    def clean_queue(self) -> str:
        from runners.models import Site

        queue = self.cleaned_data["queue"]
        if Site.objects.filter(queue=queue).exists():
            raise ValidationError(_("The queue “%(queue)s” is already used by another site."), params={"queue": queue})
        return queue


def _run(validator, value):
    return validator(value) if validator is not None else value


class NodeForm(forms.Form):
    name = forms.SlugField(label=_("Name"), max_length=100)
    host = forms.CharField(label=_("Host"), max_length=253, help_text=_("IP address or host name"))
    port = forms.IntegerField(label=_("SSH port"), initial=22, min_value=1, max_value=65535)
    username = forms.CharField(label=_("User name"), max_length=32)
    role = forms.ChoiceField(label=_("Role"))
    credential = forms.ModelChoiceField(label=_("Credential"), queryset=None, required=False)
    jump_host = forms.ModelChoiceField(label=_("Jump host"), queryset=None, required=False)

    def __init__(self, *args, site, **kwargs):
        from runners.models import Credential, Node

        super().__init__(*args, **kwargs)
        self.site = site
        self.fields["role"].choices = Node.Role.choices
        self.fields["credential"].queryset = Credential.objects.filter(site=site)
        self.fields["jump_host"].queryset = Node.objects.filter(site=site, role=Node.Role.JUMP)

    def clean_host(self) -> str:
        return _run(validate_host, self.cleaned_data["host"].strip())

    def clean_port(self) -> int:
        return _run(validate_port, self.cleaned_data["port"])

    def clean_username(self) -> str:
        return _run(validate_username, self.cleaned_data["username"].strip())

    def clean_name(self) -> str:
        from runners.models import Node

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
