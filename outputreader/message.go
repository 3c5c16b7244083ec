package outputreader

// TimeLayout is how failure times are shown: RFC 3339 with all nine
// fractional digits, so that times line up and sub-second order is visible.
const TimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// Message is the Flyte UI message of docs/DESIGN.md §3 (see Summary.Message): the
// full list says exactly what the plugin's Summarize says.
func (r *Report) Message() string { return r.Summary().Message() }

// timeNote says where a shown time comes from when it is not the
// document's own timestamp.
func timeNote(d Document) string {
	switch d.AtSource {
	case TimeFromModified:
		return " (upload time)"
	case TimeFromModifiedClamped:
		return " (upload time; the document said " + d.Failure.Time.UTC().Format(TimeLayout) + ", after it was written: its pod's clock ran ahead)"
	case TimeFromListing:
		return " (read time)"
	}
	return ""
}

// IsRecoverable follows the root cause's kind; false without a root cause.
func (r *Report) IsRecoverable() bool {
	return r.RootCause != nil && r.RootCause.Failure.Recoverable
}
