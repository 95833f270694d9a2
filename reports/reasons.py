"""The verifier's findings in the reader's language.

`reports.verify` writes its findings in English (the command line and the stored result read them); the portal
shows each in the active language. Every sentence the verifier writes is listed here as a pattern with the catalogue's
sentence carrying the same fields; a finding no pattern matches is shown as it was written.
"""
from __future__ import annotations

import re

from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

# Problems of one signature (SignatureCheck.problems).
PROBLEMS = [
    (r"the signer certificate cannot be read \((?P<error>.*)\)", gettext_noop("the signer certificate cannot be read (%(error)s)")),
    (r"bytes were changed in the signature's placeholder \(outside the signature value\)",
     gettext_noop("bytes were changed in the signature's placeholder (outside the signature value)")),
    (r"cannot be validated \((?P<error>.*)\)", gettext_noop("cannot be validated (%(error)s)")),
    (r"the signed bytes were changed \(digest mismatch\)", gettext_noop("the signed bytes were changed (digest mismatch)")),
    (r"the signature value does not match the signer's certificate",
     gettext_noop("the signature value does not match the signer's certificate")),
    (r"the signer's certificate does not chain to a trusted root(?P<detail>.*)",
     gettext_noop("the signer's certificate does not chain to a trusted root%(detail)s")),
    (r"not total document signed: (?P<n>\d+) bytes after the signed range",
     gettext_noop("not total document signed: %(n)s bytes after the signed range")),
    (r"the document was changed after this signature by more than further signatures \((?P<level>.*)\)",
     gettext_noop("the document was changed after this signature by more than further signatures (%(level)s)")),
    (r"a change after this signature is not permitted by its certification \(DocMDP\)",
     gettext_noop("a change after this signature is not permitted by its certification (DocMDP)")),
    (r"the certificates carried in the signature cannot be read \((?P<error>.*)\)",
     gettext_noop("the certificates carried in the signature cannot be read (%(error)s)")),
    (r"a carried copy of the trusted root (?P<name>.*) differs from the root",
     gettext_noop("a carried copy of the trusted root %(name)s differs from the root")),
    (r"the signature carries a certificate that no trusted root issued \((?P<name>.*)\)",
     gettext_noop("the signature carries a certificate that no trusted root issued (%(name)s)")),
    (r"the signer identifier does not match the signer's certificate",
     gettext_noop("the signer identifier does not match the signer's certificate")),
    (r"the signature's digest algorithm list (?P<listed>.*) does not name the digest used \((?P<used>.*)\)",
     gettext_noop("the signature's digest algorithm list %(listed)s does not name the digest used (%(used)s)")),
]

# Findings about the whole file (VerificationResult.reasons); a signature's problem is prefixed by its field.
REASONS = [
    (r"no trust root given: a signature can only be trusted against the vendor's root certificate",
     gettext_noop("no trust root given: a signature can only be trusted against the vendor's root certificate")),
    (r"not a readable PDF: (?P<error>.*)", gettext_noop("not a readable PDF: %(error)s")),
    (r"the PDF carries no signature", gettext_noop("the PDF carries no signature")),
    (r"the PDF has no attached files; an evidence report carries its raw artifacts and manifest\.json",
     gettext_noop("the PDF has no attached files; an evidence report carries its raw artifacts and manifest.json")),
    (r"the attached files cannot be read: (?P<error>.*)", gettext_noop("the attached files cannot be read: %(error)s")),
    (r"attachment (?P<name>.*) cannot be read \((?P<error>.*)\)", gettext_noop("attachment %(name)s cannot be read (%(error)s)")),
    (r"no (?P<manifest>\S+) attached: the attachments cannot be checked",
     gettext_noop("no %(manifest)s attached: the attachments cannot be checked")),
    (r"(?P<manifest>\S+) is not a valid report manifest: (?P<error>.*)",
     gettext_noop("%(manifest)s is not a valid report manifest: %(error)s")),
    (r"attachment (?P<name>.*): listed in the manifest but not attached",
     gettext_noop("attachment %(name)s: listed in the manifest but not attached")),
    (r"attachment (?P<name>.*): attached but not listed in the manifest",
     gettext_noop("attachment %(name)s: attached but not listed in the manifest")),
    (r"attachment (?P<name>.*): hashes to (?P<actual>\w+), the manifest says (?P<listed>\w+)",
     gettext_noop("attachment %(name)s: hashes to %(actual)s, the manifest says %(listed)s")),
    (r"The file could not be read as a signed PDF \((?P<error>.*)\)\.",
     gettext_noop("The file could not be read as a signed PDF (%(error)s).")),
]
ATTACHMENT_PROBLEMS = [
    (r"listed in the manifest but not attached", gettext_noop("listed in the manifest but not attached")),
    (r"hashes to (?P<actual>\w+), the manifest says (?P<listed>\w+)",
     gettext_noop("hashes to %(actual)s, the manifest says %(listed)s")),
]
_SIGNATURE = re.compile(r"signature (?P<field>'[^']*'|\"[^\"]*\") \((?P<signer>.*?)\): (?P<problem>.*)", re.DOTALL)


def _match(table, text: str) -> str | None:
    for pattern, sentence in table:
        found = re.fullmatch(pattern, text, flags=re.DOTALL)
        if found:
            return _(sentence) % found.groupdict()
    return None


def problem(text: str) -> str:
    """One signature's or attachment's problem in the active language."""
    return _match(PROBLEMS, text) or _match(ATTACHMENT_PROBLEMS, text) or text


def reason(text: str) -> str:
    """One of the verifier's findings in the active language."""
    found = _SIGNATURE.fullmatch(text)
    if found:
        return _("signature %(field)s (%(signer)s): %(problem)s") % {
            "field": found["field"], "signer": found["signer"], "problem": problem(found["problem"])}
    return _match(REASONS, text) or text
