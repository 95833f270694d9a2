"""The portal's forms for what touches a node: sites, nodes and SSH credentials."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from runners.credentials import MAX_KEY_BYTES
from runners.models import Credential, Node, Site
from runners.validators import validate_host, validate_port, validate_username


class SiteForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=100)
    queue = forms.SlugField(
        label=_("Celery queue"),
        max_length=64,
        help_text=_("Letters, digits, - and _; served by the worker that can reach this site"),
    )

    def clean_queue(self) -> str:
        queue = self.cleaned_data["queue"]
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
