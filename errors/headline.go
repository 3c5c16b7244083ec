package errors

import "strings"

// Headline joins a failure's code and message as "code: message", the form
// the Flyte UI and the agent's log show, without saying the code twice.
// Messages often start with their own code already: torch's error file and
// flytekit write "ValueError: batch 17 has NaN labels" for an exception whose
// type is also the document's code. Then the message stands alone:
//
//	Headline("ValueError", "ValueError: batch 17")       = "ValueError: batch 17"
//	Headline("USER:ValueError", "ValueError: batch 17")  = "USER:ValueError: batch 17"
//	Headline("OOMKilled", "worker w was killed …")       = "OOMKilled: worker w was killed …"
//
// The second form covers codes that qualify an exception type with an origin
// ("USER:", "SYSTEM:"), as flytekit's do: the type is said once, after the
// qualifier. A message starts with a code only when the code is followed by
// a colon or ends the message; "ValueErrors were seen" does not start with
// "ValueError". Leading blanks of the message are dropped, trailing ones kept.
func Headline(code, message string) string {
	msg := strings.TrimLeft(message, " \t\r\n")
	switch {
	case code == "":
		return msg
	case msg == "":
		return code
	case startsWithCode(msg, code):
		return msg
	}
	if i := strings.LastIndexByte(code, ':'); i > 0 && i < len(code)-1 {
		if typ := code[i+1:]; startsWithCode(msg, typ) {
			return code + msg[len(typ):]
		}
	}
	return code + ": " + msg
}

// startsWithCode reports whether msg is code, or starts with "code:" (or
// with code itself when code ends in a colon).
func startsWithCode(msg, code string) bool {
	rest, ok := strings.CutPrefix(msg, code)
	return ok && (rest == "" || rest[0] == ':' || strings.HasSuffix(code, ":"))
}
