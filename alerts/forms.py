from django import forms

from alerts.kinds import CATEGORIES

_CHOICES = list(CATEGORIES.items())


class PreferenceForm(forms.Form):
    email_categories = forms.MultipleChoiceField(
        choices=_CHOICES,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Email me a digest of",
    )


class WebhookForm(forms.Form):
    url = forms.URLField(max_length=500, label="URL", assume_scheme="https")
    categories = forms.MultipleChoiceField(
        choices=_CHOICES, widget=forms.CheckboxSelectMultiple, label="Send"
    )
