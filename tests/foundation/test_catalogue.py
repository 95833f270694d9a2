"""The Chinese catalogue's header says what gettext needs: merging catalogues (msgcat) can replace it with another
file's, and then every plural sentence falls back to English (ngettext needs Plural-Forms) without a warning."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.utils import translation

CATALOGUE = Path(settings.BASE_DIR) / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po"


def test_the_header_names_the_language_and_its_plural_forms():
    header = CATALOGUE.read_text(encoding="utf-8").split("\n\n", 1)[0]
    assert '"Language: zh_Hans\\n"' in header and '"Plural-Forms: nplurals=1; plural=0;\\n"' in header


def test_a_plural_sentence_is_said_in_chinese():
    with translation.override("zh-hans"):
        limited = translation.ngettext(
            "You have asked for %(n)d check in the last hour, the most one person may. Try again later.",
            "You have asked for %(n)d checks in the last hour, the most one person may. Try again later.", 3)
    assert "last hour" not in limited and "一小时" in limited, limited
