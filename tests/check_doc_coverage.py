#!/usr/bin/env python3
"""Doc coverage of the public API: every function that include/ndm/*.h
exports (NDM_API) has a doc comment that states (a) what it returns, (b) who
owns what it hands out, and (c) how it fails (STYLE.md: "Each function gets
one or two lines: what it returns, who owns the result, which errors").

    python3 tests/check_doc_coverage.py [SOURCE_ROOT] [--min PERCENT]
    python3 tests/check_doc_coverage.py --self-test

Prints the coverage, each declaration that misses a part (file:line and the
parts), and exits 1 below --min (95 by default).

Where a declaration's words come from, in this order:
  - the `/** */` comment just before it (only blanks between);
  - a comment that opens by naming another entry point, as the `_at` and
    `_to` forms do ("ndm_add_to() with an explicit call site", "Like
    ndm_manager_new, on another device"): the parts it lacks come from the
    comment of that macro or function, followed on transitively;
  - "errors as for ndm_y()": the errors of ndm_y, resolved the same way;
  - the `@name` group it sits in, when the group's comment speaks for each
    member ("Each returns ...", "Every ...", "All ...").

The three parts:
  (a) returns: "Returns"/"returns"; for a status, the statuses it names
      (NDM_OK, NDM_E_...), or its errors (it returns NDM_OK or one of
      them); for a bool, a question or true/false; for another
      value, a first sentence that names the value ("The parent (null ...)").
      A void function returns nothing and has nothing to state.
  (b) owner: asked only where something is handed out that somebody must
      own: a returned handle (array, manager, module, stream...) or pointer,
      or an out-parameter that receives one (a non-const pointer to a handle
      type, or a pointer to a pointer). The comment must say who owns it or
      how it goes ("Owner: ...", "owned by", "attached to m", "the output
      rule", "the caller releases", "static", "valid until"...). A function
      that hands out nothing (a status, a count, a flag) has nothing to own:
      the signature shows it, and no words are asked for.
  (c) errors: an NDM_E_ name, "errors as for ndm_y()" (or "the errors of
      ndm_y()") where ndm_y states them, or a statement that it cannot fail ("never fails").
"""
import os
import re
import shutil
import sys
import tempfile

DOC = re.compile(r"/\*\*(.*?)\*/", re.S)
ANY_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", re.M)
INLINE = re.compile(r"^[ \t]*static[ \t]+inline\b[^;{(]*?\b(\w+)\s*\(", re.M)
API = re.compile(r"^[ \t]*NDM_API\b", re.M)
TYPEDEF_STRUCT = re.compile(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", re.S)

# (a)
RETURNS_WORD = re.compile(r"\b[Rr]eturn(s|ed|ing)?\b")
STATUS_NAME = re.compile(r"\bNDM_(OK|ALREADY|E_\w+)\b|\bstatus\b")
BOOL_WORDS = re.compile(r"\?|\btrue\b|\bfalse\b|\b[Ww]hether\b")
VALUE_START = re.compile(r"^(The|A|An|Its|This|Number|How many|Which|What|One|Each|Every|"
                         r"Whether|Is|Are|Does|Has|Can)\b")
# (b)
OWNER = re.compile(r"\b[Oo]wn(s|ed|er|ers|ership|ing)?\b|\bdeleter\b|\battach(ed|es)?\b|"
                   r"\boutput rule\b|\b[Rr]eleases?\b|\b[Cc]los(e|es|ed|ing)\b|\bfree(s|d)?\b|"
                   r"\bstatic\b|"
                   r"\bvalid until\b|\b[Bb]elong(s)?\b|\b[Bb]orrow(s|ed)?\b|\blent\b|"
                   r"\bchild of\b|\bkept by\b|\bheld by\b|\blives? (as long as|until|while)\b|"
                   r"\bthe caller'?s?(?=[.;,)]| to\b| must\b| release| own| close| free)")
# (c)
ERROR_NAME = re.compile(r"\bNDM_E_\w+")
NO_FAILURE = re.compile(r"\b([Nn]ever fails?|[Ff]ails never|[Cc]annot fail|[Dd]oes not fail|"
                        r"[Nn]o errors?|Errors: none)\b")
ERRORS_AS = re.compile(r"\b[Ee]rrors?\s+(?:(?:are\s+)?(?:as|like)\s+(?:for|in|of|with|from)?|of)"
                       r"\s*`?(ndm_\w+)")
# a comment that opens by naming the entry point it is a form of
FORM_OF = re.compile(r"^(?:(?:Like|As|Same as|As for)\s+`?(ndm_\w+)(?:\(\))?`?|"
                     r"`?(ndm_\w+)\(\)`?|`?(ndm_\w+)`?(?=\s+with(out)?\b))")
COLLECTIVE = re.compile(r"\b(Each|Every|All|each|every|all of them|all its)\b")
PARTS = ("returns", "owner", "errors")


def clean(doc):
    """A doc comment's text without its leading stars."""
    lines = [re.sub(r"^\s*\*( |$)?", "", ln) for ln in doc.split("\n")]
    return " ".join(ln.strip() for ln in lines).strip()


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


class Entity:
    def __init__(self, name, path, line, doc, group, sig=None):
        self.name, self.path, self.line, self.doc, self.group, self.sig = \
            name, path, line, doc, group, sig


def doc_before(text, docs, pos):
    """The doc comment that ends just before pos (only blanks between)."""
    best = None
    for start, end, body in docs:
        if end <= pos and text[end:pos].strip() == "":
            best = body
        if end > pos:
            break
    if best is None or re.fullmatch(r"\s*@[{}]\s*", best):
        return None
    return clean(best)


def groups_of(text, docs):
    """(start, end, group comment) for each @name ... @{ ... @} block."""
    out = []
    i = 0
    while i < len(docs):
        start, end, body = docs[i]
        if re.match(r"\s*[@\\]name\b", body) and i + 1 < len(docs) and \
                re.fullmatch(r"\s*@\{\s*", docs[i + 1][2]):
            open_end = docs[i + 1][1]
            j = i + 2
            while j < len(docs) and not re.fullmatch(r"\s*@\}\s*", docs[j][2]):
                j += 1
            close = docs[j][0] if j < len(docs) else len(text)
            words = clean(re.sub(r"^\s*[@\\]name[^\n]*", "", body, count=1))
            out.append((open_end, close, words))
            i = j
        i += 1
    return out


def strip_comments(s):
    return ANY_COMMENT.sub(" ", s)


def parse(path, text):
    """The entities (documented macros, inline functions, NDM_API
    declarations) of one header, and its resource types."""
    docs = [(m.start(), m.end(), m.group(1)) for m in DOC.finditer(text)]
    groups = groups_of(text, docs)
    comment_spans = [(m.start(), m.end()) for m in ANY_COMMENT.finditer(text)]

    def in_comment(pos):
        return any(a <= pos < b for a, b in comment_spans)

    def group_at(pos):
        for a, b, words in groups:
            if a <= pos < b:
                return words
        return None

    entities, decls = [], []
    for m in DEFINE.finditer(text):
        if in_comment(m.start()):
            continue
        entities.append(Entity(m.group(1), path, line_of(text, m.start()),
                               doc_before(text, docs, m.start()), group_at(m.start())))
    for m in INLINE.finditer(text):
        if in_comment(m.start()):
            continue
        entities.append(Entity(m.group(1), path, line_of(text, m.start()),
                               doc_before(text, docs, m.start()), group_at(m.start())))
    for m in API.finditer(text):
        if in_comment(m.start()):
            continue
        end = text.find(";", m.end())
        brace = text.find("{", m.end())
        if brace != -1 and brace < end:
            end = brace
        decl = strip_comments(text[m.end():end])
        paren = decl.find("(")
        if paren < 0:
            continue
        head = decl[:paren].split()
        if not head:
            continue
        name = head[-1].lstrip("*")
        ret = " ".join(head[:-1]) + ("*" if head[-1].startswith("*") else "")
        ret = re.sub(r"\b(NDM_NODISCARD|NDM_NORETURN|NDM_PRINTF\([^)]*\)|extern)\b", "", ret)
        params = decl[paren + 1:decl.rfind(")")]
        ent = Entity(name, path, line_of(text, m.start()), doc_before(text, docs, m.start()),
                     group_at(m.start()), (ret.strip(), params))
        entities.append(ent)
        decls.append(ent)
    structs = {}
    for m in TYPEDEF_STRUCT.finditer(text):
        structs[m.group(3)] = m.group(2)
    return entities, decls, structs


def resource_types(structs):
    """Handle types (a struct holding a slot id) and structs that carry one or
    a pointer: what someone must own when it is handed out."""
    res = {"ndm_array", "ndm_manager"}
    changed = True
    while changed:
        changed = False
        for name, body in structs.items():
            if name in res:
                continue
            body = strip_comments(body)
            if re.search(r"\buint64_t\s+id\s*;", body) or "*" in body or \
                    any(re.search(r"\b%s\b" % t, body) for t in res):
                res.add(name)
                changed = True
    return res


def split_params(params):
    out, depth, cur = [], 0, ""
    for ch in params:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [p.strip() for p in out if p.strip()]


def hands_out(sig, resources):
    """What a declaration hands out that someone must own (None: nothing)."""
    ret, params = sig
    if "*" in ret:
        return "the returned pointer"
    base = ret.replace("const", "").strip()
    if base in resources or base.startswith("struct "):
        return "the returned " + base
    for p in split_params(params):
        if p in ("void", "NDM_SITE_PARAMS", "..."):
            continue
        if "(" in p:  # a callback
            continue
        if p.count("*") >= 2 and not re.match(r"const\s+char\s*\*\s*const\s*\*", p):
            if not re.match(r"^const\b.*\*\s*const\b", p):
                return "the pointer written to " + p.split()[-1].lstrip("*")
        m = re.match(r"^(?!const\b)(?:struct\s+)?(\w+)\s*\*\s*(\w+)$", p)
        if m and m.group(1) in resources:
            return "the %s written to %s" % (m.group(1), m.group(2))
    return None


def states(text, part, sig):
    """Does text state this part for a declaration of signature sig?"""
    if not text:
        return False
    ret = sig[0].replace("const", "").strip()
    if part == "returns":
        if RETURNS_WORD.search(text):
            return True
        if ret == "ndm_status":
            return bool(STATUS_NAME.search(text))
        if ret == "bool":
            return bool(BOOL_WORDS.search(text))
        if ret in ("ndm_array", "ndm_manager") and re.search(r"\bnull handle\b", text):
            return True
        return bool(VALUE_START.match(text))
    if part == "owner":
        return bool(OWNER.search(text))
    if part == "errors":
        return bool(ERROR_NAME.search(text) or NO_FAILURE.search(text))
    raise ValueError(part)


class Index:
    def __init__(self, entities, resources):
        self.by_name = {}
        for e in entities:
            # a documented entity wins over an undocumented one of the same name
            if e.name not in self.by_name or (e.doc and not self.by_name[e.name].doc):
                self.by_name[e.name] = e
        self.resources = resources

    def resolve(self, ent, part, sig, seen=None):
        """Where this part is stated for ent: a description, or None."""
        seen = set() if seen is None else seen
        if ent.name in seen:
            return None
        seen.add(ent.name)
        doc = ent.doc
        how = self.from_text(doc, part, sig, seen)
        if how:
            return how
        if doc:
            m = FORM_OF.match(doc)
            if m:
                target = next(g for g in m.groups()[:3] if g)
                other = self.by_name.get(target)
                if other is not None and other.name != ent.name:
                    how = self.resolve(other, part, sig, seen)
                    if how:
                        return "as " + other.name + (": " + how if how != "its comment" else "")
        if ent.group and COLLECTIVE.search(ent.group):
            how = self.from_text(ent.group, part, sig, seen)
            if how:
                return "its group" + ("" if how == "its comment" else ": " + how)
        return None

    def from_text(self, text, part, sig, seen):
        """This part stated by the words of one comment, or by the entry
        point its "errors as for ndm_y()" names."""
        if states(text, part, sig):
            return "its comment"
        if text and part == "errors":
            for m in ERRORS_AS.finditer(text):
                other = self.by_name.get(m.group(1))
                if other is not None and self.resolve(other, part, sig, set(seen)):
                    return "errors as for " + other.name
        return None


def check(root):
    """(results, problems): results[i] = (decl, {part: how or None or 'n/a'})."""
    inc = os.path.join(root, "include", "ndm")
    entities, decls, structs = [], [], {}
    for name in sorted(os.listdir(inc)):
        if not name.endswith(".h"):
            continue
        path = os.path.join(inc, name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        e, d, s = parse(os.path.relpath(path, root), text)
        entities += e
        decls += d
        structs.update(s)
    resources = resource_types(structs)
    index = Index(entities, resources)
    results = []
    for d in decls:
        got = {}
        ret = d.sig[0].replace("const", "").strip()
        owned = hands_out(d.sig, resources)
        for part in PARTS:
            if part == "returns" and ret == "void" and "*" not in d.sig[0]:
                got[part] = "n/a (void)"
            elif part == "owner" and owned is None:
                got[part] = "n/a (hands out nothing)"
            else:
                got[part] = index.resolve(d, part, d.sig)
        if not got["returns"] and ret == "ndm_status" and got["errors"]:
            got["returns"] = "a status: NDM_OK or its errors"
        results.append((d, got, owned))
    return results


def report(results, minimum, out=sys.stdout, verbose=False):
    total = len(results)
    full = sum(1 for _, got, _ in results if all(got.values()))
    pct = 100.0 * full / total if total else 100.0
    for d, got, owned in results:
        missing = [p for p in PARTS if not got[p]]
        if missing:
            what = ", ".join(("owner of " + owned) if p == "owner" else p for p in missing)
            print(f"{d.path}:{d.line}: {d.name}: states no {what}", file=out)
        elif verbose:
            print(f"{d.path}:{d.line}: {d.name}: " +
                  "; ".join(f"{p}: {got[p]}" for p in PARTS), file=out)
    per = {p: sum(1 for _, got, _ in results if got[p]) for p in PARTS}
    print(f"doc coverage: {full} of {total} public functions ({pct:.1f}%) state what they "
          f"return, who owns it and their errors (returns {per['returns']}, owner "
          f"{per['owner']}, errors {per['errors']}); minimum {minimum:g}%", file=out)
    return 0 if pct >= minimum else 1


# The self-test's headers: (what, header text, {function: missing parts}).
PLANTED = r"""
/* planted: a header of the self-test. */
typedef struct ndm_thing { uint64_t id; } ndm_thing;

/** A new thing, owned by m. Returns the null handle on failure:
 *  NDM_E_CLOSED for a closed m. */
#define ndm_thing_new(m) ndm_thing_new_at(NDM_HERE, (m))
/** ndm_thing_new() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_thing ndm_thing_new_at(NDM_SITE_PARAMS, ndm_manager m);
/** Returns a thing. */
NDM_API ndm_thing ndm_thing_silent(ndm_manager m);
/** The count of things in m (0 for a stale m, never fails). */
NDM_API int64_t ndm_thing_count(ndm_manager m);
/** Frob it. NDM_OK; NDM_E_INVALID for a bad flag. */
NDM_API ndm_status ndm_thing_frob(ndm_thing t, unsigned flags);
/** Unfrob it. Errors as for ndm_thing_frob(). */
NDM_API ndm_status ndm_thing_unfrob(ndm_thing t, unsigned flags);
/** Unfrob it harder. Errors as for ndm_thing_nothing(). */
NDM_API ndm_status ndm_thing_unfrob_hard(ndm_thing t);
/** Fill *out. NDM_OK or NDM_E_OOM. */
NDM_API ndm_status ndm_thing_make(ndm_manager m, ndm_thing *out);
/** Fill *out. Returns NDM_OK; Owner: m (closing it frees *out); Errors: NDM_E_OOM. */
NDM_API ndm_status ndm_thing_make2(ndm_manager m, ndm_thing *out);
NDM_API ndm_status ndm_thing_bare(ndm_thing t);
/** Like ndm_thing_new(), on another device (NDM_E_DEVICE when it is absent). */
NDM_API ndm_thing ndm_thing_new_on(ndm_manager m, int device);
/** The innermost live thing of this thread (null when none; never fails). */
NDM_API ndm_thing ndm_thing_current(void);
/** The thing's name, a static string; never fails. */
NDM_API const char *ndm_thing_name(ndm_thing t);
/** The thing's label. */
NDM_API const char *ndm_thing_label(ndm_thing t);

/** @name Twiddles
 *  Each returns NDM_OK, or errors as for ndm_thing_frob(). */
/** @{ */
/** Twiddle it. */
NDM_API ndm_status ndm_thing_twiddle(ndm_thing t);
/** @} */

/** @name Pairs
 *  Each returns a new array attached by the output rule, or the null handle:
 *  NDM_E_SHAPE, NDM_E_NULL. */
/** @{ */
/** a @ b. */
#define ndm_pair(a, b) ndm_pair_to_at(NDM_HERE, NDM_OUTPUT_RULE, (a), (b))
/** ndm_pair() with the result attached to m instead of by the output rule. */
#define ndm_pair_to(m, a, b) ndm_pair_to_at(NDM_HERE, (m), (a), (b))
/** ndm_pair_to() with an explicit call site (the macro passes NDM_HERE). */
NDM_API ndm_array ndm_pair_to_at(NDM_SITE_PARAMS, ndm_manager out, ndm_array a, ndm_array b);
/** @} */

/** @name Loose group
 *  Some arrays. */
/** @{ */
/** a # b. */
NDM_API ndm_array ndm_loose(ndm_array a, ndm_array b);
/** @} */
"""
EXPECTED = {
    "ndm_thing_new_at": set(),
    "ndm_thing_silent": {"owner", "errors"},
    "ndm_thing_count": set(),
    "ndm_thing_frob": set(),
    "ndm_thing_unfrob": set(),
    "ndm_thing_unfrob_hard": {"returns", "errors"},
    "ndm_thing_make": {"owner"},
    "ndm_thing_make2": set(),
    "ndm_thing_bare": {"returns", "errors"},
    "ndm_thing_new_on": set(),
    "ndm_thing_current": {"owner"},
    "ndm_thing_name": set(),
    "ndm_thing_label": {"owner", "errors"},
    "ndm_thing_twiddle": set(),
    "ndm_pair_to_at": set(),
    "ndm_loose": {"returns", "owner", "errors"},
}


def self_test(root):
    """The rules on a planted header, and the gate: planting undocumented
    functions in a copy of the headers drops the coverage below the minimum
    and must fail the check."""
    failed = 0
    tmp = tempfile.mkdtemp()
    try:
        os.makedirs(os.path.join(tmp, "include", "ndm"))
        with open(os.path.join(tmp, "include", "ndm", "planted.h"), "w") as f:
            f.write(PLANTED)
        results = check(tmp)
        seen = {}
        for d, got, _ in results:
            seen[d.name] = {p for p in PARTS if not got[p]}
        for name, want in EXPECTED.items():
            have = seen.get(name)
            if have != want:
                print(f"self-test: {name}: expected missing {sorted(want)}, got "
                      f"{sorted(have) if have is not None else 'no declaration'}")
                failed = 1
        if not failed:
            print(f"self-test: the rules hold on a planted header ({len(EXPECTED)} cases)")
    finally:
        shutil.rmtree(tmp)
    tmp = tempfile.mkdtemp()
    try:
        shutil.copytree(os.path.join(root, "include"), os.path.join(tmp, "include"))
        n = len(check(tmp))
        # enough bare declarations to take the coverage under 95%
        extra = n // 10 + 1
        with open(os.path.join(tmp, "include", "ndm", "planted.h"), "w") as f:
            f.write("/* planted */\n" + "".join(
                f"/** Does something. */\nNDM_API ndm_array ndm_planted_{i}(ndm_array a);\n"
                for i in range(extra)))
        results = check(tmp)
        listed = [d for d, got, _ in results if d.name.startswith("ndm_planted_")
                  and not all(got.values())]
        with open(os.devnull, "w") as devnull:
            rc = report(results, 95, out=devnull)
        if rc == 1 and len(listed) == extra:
            print(f"self-test: {extra} planted undocumented functions are listed and fail "
                  f"the 95% gate")
        else:
            print(f"self-test: {extra} planted functions: {len(listed)} listed, exit {rc} "
                  "(expected all listed and exit 1)")
            failed = 1
    finally:
        shutil.rmtree(tmp)
    return failed


def main():
    args = sys.argv[1:]
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    minimum = 95.0
    verbose = False
    if "--min" in args:
        i = args.index("--min")
        minimum = float(args[i + 1])
        del args[i:i + 2]
    if "--verbose" in args:
        args.remove("--verbose")
        verbose = True
    if args and args[0] == "--self-test":
        return self_test(args[1] if len(args) > 1 else root)
    if args:
        root = args[0]
    return report(check(root), minimum, verbose=verbose)


if __name__ == "__main__":
    sys.exit(main())
