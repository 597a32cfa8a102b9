"""The engine's reading of a request body, for FuzzEngineReading.

A Python engine (vLLM, SGLang) decodes a body with json.loads and
validates its pydantic model from the dict it gets. This reads each body
the same way and reports the routing view that kvroute's request.Parse
must give of it, by the view's rules (the types the router accepts, its
template, its error codes), so that the two readings can be compared
field by field; or why Parse must refuse it.

Protocol, one request after another on stdin, one answer a line on stdout:
a line of JSON, {"kind": "chat"|"completion", "n": N, "session": field,
"tools": text, "session_key": text}, then N bytes of body. "tools" and
"session_key" are Parse's own (its tools as compact JSON, one a line, and
its session key): they are checked to be JSON texts of the same values
json.loads found, since Python cannot give a value's raw text. The answer
is {"loads": false, "why": ...} when json.loads refuses the body;
{"loads": true, "strict": why} when json.loads reads it but the router
refuses it on purpose (see request/scan.go); {"loads": true, "code": c}
for a refusal of the view; else {"loads": true, "view": {...}}.
"""

import json
import sys

MAX_DEPTH = 512
INT64 = (-(1 << 63), 1 << 63)
LIMITS = {"messages": 100000, "parts": 10000, "items": 1000000, "calls": 100000, "tools": 10000}


class Refuse(Exception):
    def __init__(self, code):
        super().__init__(code)
        self.code = code


def strict(body, value):
    """Why the router refuses a body json.loads reads, or None."""
    if body.startswith(b"\xef\xbb\xbf"):
        return "byte order mark"
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)) and depth > MAX_DEPTH:
            return "nesting"
        if isinstance(v, dict):
            for k, x in v.items():
                if has_surrogate(k):
                    return "surrogate"
                stack.append((x, depth + 1))
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, str) and has_surrogate(v):
            return "surrogate"
    return None


def has_surrogate(s):
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def typed(v, *types):
    """v if it is None or of one of types (an int is not a bool), else a
    type error, which the router answers with invalid_json."""
    if v is None:
        return v
    for t in types:
        if type(v) is t:
            if t is int and not INT64[0] <= v < INT64[1]:
                break
            return v
    raise Refuse("invalid_json")


def get(d, key, *types):
    return typed(d.get(key) if isinstance(d, dict) else None, *types)


def content_text(c):
    """The text of a content, or the fault code of its message."""
    if c is None:
        return "", 0
    if isinstance(c, str):
        return c, 0
    if not isinstance(c, list):
        return None, 0
    out = []
    for p in c:
        if not isinstance(p, dict):
            return None, 0
        typ, text = p.get("type"), p.get("text")
        if not (typ is None or isinstance(typ, str)) or not (text is None or isinstance(text, str)):
            return None, 0
        typ, text = typ or "", text or ""
        out.append(text if typ in ("text", "input_text") else "<|" + typ + "|>")
    return "".join(out), len(c)


def chat(d, tools_text):
    msgs = typed(d.get("messages"), list)
    tools = typed(d.get("tools"), list) or []
    max_comp = get(d, "max_completion_tokens", int)
    read = []
    for m in msgs or []:
        typed(m, dict)
        m = m or {}
        calls = []
        for c in typed(m.get("tool_calls"), list) or []:
            typed(c, dict)
            f = typed((c or {}).get("function"), dict) or {}
            calls.append((get(f, "name", str) or "", get(f, "arguments", str) or ""))
        get(m, "name", str)
        read.append((get(m, "role", str) or "", m.get("content"), calls))
    if not read:
        raise Refuse("missing_messages")
    if len(read) > LIMITS["messages"]:
        raise Refuse("too_many_messages")
    if sum(len(c) for _, _, c in read) > LIMITS["calls"]:
        raise Refuse("too_many_tool_calls")
    if len(tools) > LIMITS["tools"]:
        raise Refuse("too_many_tools")
    out = []
    first = None
    for i, (role, c, calls) in enumerate(read):
        if role == "":
            raise Refuse("invalid_message")
        text, parts = content_text(c)
        if text is None or parts > LIMITS["parts"]:
            raise Refuse("invalid_message" if text is None else "too_many_content_parts")
        if role == "user" and first is None:
            first = text
        out.append("<|" + role + "|>\n" + text + "".join("<|tool_call|>" + n + " " + a for n, a in calls) + "\n")
    out.append("<|assistant|>\n")
    # The router keeps each tool's own JSON text: the same values.
    lines = tools_text.split("\n")[:-1] if tools_text else []
    if [canon_text(t) for t in lines] != [canon(t) for t in tools]:
        return {"tools_differ": [lines, [canon(t) for t in tools]]}, None, None
    if tools:
        out.insert(0, "<|tools|>\n" + tools_text)
    return "".join(out), first or "", max_comp


def base36(t):
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    s, u = "", abs(t)
    while True:
        s = digits[u % 36] + s
        u //= 36
        if u == 0:
            break
    return ("-" if t < 0 else "") + s + " "


def is_token(t):
    return type(t) is int and INT64[0] <= t < INT64[1]


def completion(d):
    p = d.get("prompt")
    if p is None:
        raise Refuse("missing_prompt")
    if isinstance(p, str):
        return p, None
    if not isinstance(p, list):
        raise Refuse("invalid_prompt")
    if not p or isinstance(p[0], str):
        if not all(isinstance(s, str) for s in p):
            raise Refuse("invalid_prompt")
        if len(p) > LIMITS["items"]:
            raise Refuse("too_many_prompt_items")
        return "".join(p), None
    if isinstance(p[0], list):
        if not all(isinstance(b, list) and all(is_token(t) for t in b) for b in p):
            raise Refuse("invalid_prompt")
        toks = [t for b in p for t in b]
    else:
        if not all(is_token(t) for t in p):
            raise Refuse("invalid_prompt")
        toks = p
    if len(toks) > LIMITS["items"]:
        raise Refuse("too_many_prompt_items")
    return "".join(base36(t) for t in toks), len(toks)


def canon(v):
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def canon_text(t):
    try:
        return canon(json.loads(t))
    except ValueError:
        return "not JSON: " + t


def view(req, d):
    if not isinstance(d, dict):
        raise Refuse("invalid_json")
    model = get(d, "model", str) or ""
    stream = bool(get(d, "stream", bool))
    ignore_eos = bool(get(d, "ignore_eos", bool))
    max_tokens = get(d, "max_tokens", int)
    min_tokens = get(d, "min_tokens", int)
    so = typed(d.get("stream_options"), dict)
    usage = so is not None and bool(get(so, "include_usage", bool))
    first, exact = "", None
    if req["kind"] == "chat":
        prompt, first, max_comp = chat(d, req["tools"])
        if isinstance(prompt, dict):
            return prompt
        if max_comp is not None:
            max_tokens = max_comp
    else:
        prompt, exact = completion(d)
    if max_tokens is not None and max_tokens < 0:
        raise Refuse("invalid_max_tokens")
    if min_tokens is not None and min_tokens < 0:
        raise Refuse("invalid_min_tokens")
    session = ""
    field = req["session"]
    if field and field in d:
        s = d[field]
        if isinstance(s, str):
            session = s
        elif s is not None:
            # The router keeps the value's own JSON text: the same value.
            if canon_text(req["session_key"]) != canon(s):
                return {"session_differs": [req["session_key"], canon(s)]}
            session = req["session_key"]
    n = len(prompt.encode("utf-8"))
    return {
        "Model": model,
        "Prompt": prompt,
        "FirstUser": first,
        "SessionKey": session,
        "PromptTokens": exact if exact is not None else (n + 3) // 4,
        "PromptExact": exact is not None,
        "MaxTokens": max_tokens or 0,
        "MinTokens": min_tokens or 0,
        "IgnoreEOS": ignore_eos,
        "Stream": stream,
        "IncludeUsage": usage,
    }


def answer(req, body):
    constants = []

    def constant(c):
        constants.append(c)
        return float(c)

    try:
        d = json.loads(body, parse_constant=constant)
    except (ValueError, RecursionError) as e:
        return {"loads": False, "why": type(e).__name__}
    why = "NaN or Infinity" if constants else strict(body, d)
    if why:
        return {"loads": True, "strict": why}
    try:
        return {"loads": True, "view": view(req, d)}
    except Refuse as r:
        return {"loads": True, "code": r.code}


def main():
    sys.setrecursionlimit(1000)
    stdin, stdout = sys.stdin.buffer, sys.stdout
    while True:
        line = stdin.readline()
        if not line:
            return
        req = json.loads(line)
        body = stdin.read(req["n"])
        stdout.write(json.dumps(answer(req, body)) + "\n")
        stdout.flush()


main()
