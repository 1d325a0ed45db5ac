// Grammar-constrained sampling and JSON-schema conversion through
// llama.cpp's own code in the pinned ollama module (no sources copied):
// llama-grammar.h from llama/llama.cpp/src (compiled by the module's src
// package) and llama/llama.cpp/common/json-schema-to-grammar.cpp, compiled
// here as part of this unit (the module's common package cannot build
// from the module zip: it lacks vendor/nlohmann, which Debian's
// nlohmann-json3-dev provides; its common.cpp is not needed).
#include "grammar.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <string>

#include <functional>
#include <vector>

#include "llama-grammar.h"
#include "json-schema-to-grammar.cpp" // the module's converter (common/)

// The three string helpers of common.cpp the converter calls (declared in
// its common.h); common.cpp itself is not compiled.
std::string string_join(const std::vector<std::string> &values, const std::string &sep) {
	std::string out;
	for (size_t i = 0; i < values.size(); i++) {
		if (i > 0) {
			out += sep;
		}
		out += values[i];
	}
	return out;
}

std::vector<std::string> string_split(const std::string &str, const std::string &delim) {
	std::vector<std::string> parts;
	size_t start = 0;
	for (;;) {
		size_t at = delim.empty() ? std::string::npos : str.find(delim, start);
		if (at == std::string::npos) {
			parts.push_back(str.substr(start));
			return parts;
		}
		parts.push_back(str.substr(start, at - start));
		start = at + delim.size();
	}
}

std::string string_repeat(const std::string &str, size_t n) {
	std::string out;
	out.reserve(str.size() * n);
	for (size_t i = 0; i < n; i++) {
		out += str;
	}
	return out;
}

struct mp_grammar {
	llama_grammar *g;
	const llama_vocab *vocab;
};

static void fill(char *err, size_t errlen, const std::string &msg) {
	if (errlen == 0) {
		return;
	}
	size_t n = msg.size() < errlen - 1 ? msg.size() : errlen - 1;
	memcpy(err, msg.data(), n);
	err[n] = 0;
}

// ruleAlts is every rule of a parsed grammar split into its alternatives.
typedef std::vector<std::vector<std::vector<llama_grammar_element>>> ruleAlts;

// alternatives splits a parsed rule into its alternatives.
static std::vector<std::vector<llama_grammar_element>> alternatives(const llama_grammar_rule &rule) {
	std::vector<std::vector<llama_grammar_element>> alts(1);
	for (const auto &e : rule) {
		if (e.type == LLAMA_GRETYPE_END) {
			break;
		}
		if (e.type == LLAMA_GRETYPE_ALT) {
			alts.emplace_back();
			continue;
		}
		alts.back().push_back(e);
	}
	return alts;
}

// recursesWithoutInput reports whether a rule can reach itself without
// consuming input: through its leftmost rule references, and past every
// reference that can match the empty string. llama.cpp's own check misses
// a rule that is nullable only through other rules (e.g. ("a"* "a"*)*),
// and such a grammar recurses without end when it is initialised (a stack
// overflow: the process dies). Nullability is computed as a fixpoint over
// all rules first.
static bool recursesWithoutInput(const ruleAlts &alts, std::string &why) {
	size_t n = alts.size();
	std::vector<bool> nullable(n, false);
	for (bool changed = true; changed;) {
		changed = false;
		for (size_t i = 0; i < n; i++) {
			if (nullable[i]) {
				continue;
			}
			for (const auto &alt : alts[i]) {
				bool all = true;
				for (const auto &e : alt) {
					if (e.type != LLAMA_GRETYPE_RULE_REF || e.value >= n || !nullable[e.value]) {
						all = false;
						break;
					}
				}
				if (all) {
					nullable[i] = changed = true;
					break;
				}
			}
		}
	}
	// Edges: i → j when j can be reached from i's start consuming nothing.
	std::vector<std::vector<size_t>> next(n);
	for (size_t i = 0; i < n; i++) {
		for (const auto &alt : alts[i]) {
			for (const auto &e : alt) {
				if (e.type != LLAMA_GRETYPE_RULE_REF || e.value >= n) {
					break;
				}
				next[i].push_back(e.value);
				if (!nullable[e.value]) {
					break;
				}
			}
		}
	}
	// Iterative DFS for a cycle (0 new, 1 on the path, 2 done).
	std::vector<int> state(n, 0);
	for (size_t start = 0; start < n; start++) {
		if (state[start] != 0) {
			continue;
		}
		std::vector<std::pair<size_t, size_t>> path = {{start, 0}};
		state[start] = 1;
		while (!path.empty()) {
			auto &top = path.back();
			if (top.second == next[top.first].size()) {
				state[top.first] = 2;
				path.pop_back();
				continue;
			}
			size_t j = next[top.first][top.second++];
			if (state[j] == 1) {
				why = "rule " + std::to_string(j) + " can reach itself without consuming input (left recursion, possibly through rules that can match nothing, such as a repetition of something that can be empty)";
				return true;
			}
			if (state[j] == 0) {
				state[j] = 1;
				path.push_back({j, 0});
			}
		}
	}
	return false;
}

// maxAdvanceWork bounds the calls llama.cpp's advance_stack may make to
// advance one stack past rules that can match nothing (see advanceTooCostly).
static const double maxAdvanceWork = 100000;

// advanceTooCostly bounds, for every position in every rule, two costs of
// llama.cpp's advance_stack when a stack stands there:
//   - work: the recursive calls it makes: one per rule reference entered,
//     and, past a reference that can match nothing, once more for the rest
//     of the alternative per way it can match nothing (nested optional
//     repetitions such as ((("a"?){2}){2}){2} double that count per level:
//     2^17 ways overflow the stack without any cycle);
//   - fan-out: the stacks it leaves behind, one per terminal it can reach
//     consuming nothing. A sequence of 10,000 optional items leaves 10,000
//     stacks at the start, each compared with the others as it is added
//     (quadratic: seconds at admission, issue 37 row 3), where the apply
//     bound (maxStacks, engine.MaxGrammarStacks) would refuse it at the
//     first token anyway: such a grammar is refused before it is built.
// Each alternative is walked once from its end (linear in the grammar's
// size); the nullable graph must be acyclic (recursesWithoutInput first).
// A rule entered again while it is being measured counts 0 (it is reached
// only after input was consumed).
static bool advanceTooCostly(const ruleAlts &alts, size_t maxStacks, std::string &why) {
	size_t n = alts.size();
	auto sat = [](double x) { return x > 1e15 ? 1e15 : x; };
	// empties[r]: ways rule r matches the empty string (saturating).
	std::vector<double> empties(n, -1);
	std::vector<bool> busy(n, false);
	std::function<double(size_t)> emptyWays = [&](size_t r) -> double {
		if (empties[r] >= 0) {
			return empties[r];
		}
		if (busy[r]) {
			return 0; // a cycle through non-empty paths only
		}
		busy[r] = true;
		double total = 0;
		for (const auto &alt : alts[r]) {
			double ways = 1;
			for (const auto &e : alt) {
				if (e.type != LLAMA_GRETYPE_RULE_REF || e.value >= n) {
					ways = 0;
					break;
				}
				ways = sat(ways * emptyWays(e.value));
				if (ways == 0) {
					break;
				}
			}
			total = sat(total + ways);
		}
		busy[r] = false;
		empties[r] = total;
		return total;
	};
	struct cost {
		double work, stacks;
	};
	std::vector<cost> rules(n, cost{-1, -1});
	std::vector<bool> measuring(n, false);
	std::function<cost(size_t)> ruleCost;
	// walk fills at[i] with the cost of advancing at position i of alt
	// (at[alt.size()]: the alternative's end, popped to its caller) and
	// returns false when one is over a bound (why filled).
	auto walk = [&](size_t r, const std::vector<llama_grammar_element> &alt, std::vector<cost> &at) -> bool {
		at.assign(alt.size() + 1, cost{1, 1});
		at[alt.size()].stacks = 0; // popped: the caller counts what follows
		for (size_t i = alt.size(); i-- > 0;) {
			const auto &e = alt[i];
			if (e.type != LLAMA_GRETYPE_RULE_REF || e.value >= n) {
				continue; // a terminal: one stack, one step
			}
			cost c = ruleCost(e.value);
			cost here{sat(1 + c.work), c.stacks};
			double ways = emptyWays(e.value);
			if (ways > 0) {
				here.work = sat(here.work + ways * at[i + 1].work);
				here.stacks = sat(here.stacks + at[i + 1].stacks);
			}
			at[i] = here;
			if (here.work > maxAdvanceWork) {
				why = "advancing past rule " + std::to_string(r) + " takes about " + std::to_string((long long)here.work) +
					" steps, more than the " + std::to_string((long long)maxAdvanceWork) +
					" allowed (nested optional or repeated parts that can match nothing multiply the ways through them)";
				return false;
			}
			if (here.stacks > double(maxStacks)) {
				why = "a point in rule " + std::to_string(r) + " can be followed by " + std::to_string((long long)here.stacks) +
					" different things at once (parse stacks), more than the " + std::to_string(maxStacks) +
					" allowed (a long run of optional parts: its cost per token is too high)";
				return false;
			}
		}
		return true;
	};
	bool over = false;
	ruleCost = [&](size_t r) -> cost {
		if (rules[r].work >= 0) {
			return rules[r];
		}
		if (measuring[r] || over) {
			return cost{0, 0};
		}
		measuring[r] = true;
		cost total{0, 0};
		std::vector<cost> at;
		for (const auto &alt : alts[r]) {
			if (!walk(r, alt, at)) {
				over = true;
				break;
			}
			total.work = sat(total.work + at[0].work);
			total.stacks = sat(total.stacks + at[0].stacks);
		}
		measuring[r] = false;
		rules[r] = total;
		return total;
	};
	for (size_t r = 0; r < n && !over; r++) {
		if (cost c = ruleCost(r); !over && c.stacks > double(maxStacks)) {
			why = "rule " + std::to_string(r) + " can start with " + std::to_string((long long)c.stacks) +
				" different things at once (parse stacks), more than the " + std::to_string(maxStacks) + " allowed";
			return true;
		}
	}
	return over;
}

// classLen is the elements of the character class that starts at e (a
// CHAR or CHAR_NOT and the RNG_UPPER/ALT elements that extend it): what
// matching one code point against it costs. 1 for anything else.
static size_t classLen(const llama_grammar_element *e) {
	if (e->type != LLAMA_GRETYPE_CHAR && e->type != LLAMA_GRETYPE_CHAR_NOT) {
		return 1;
	}
	size_t n = 1;
	while (e[n].type == LLAMA_GRETYPE_CHAR_ALT || e[n].type == LLAMA_GRETYPE_CHAR_RNG_UPPER) {
		n++;
	}
	return n;
}

// classTooLarge reports a character class longer than maxClass elements
// (a 4,000-code-point class made one apply cost seconds: every candidate
// token's code points are matched against it, once per live stack).
static bool classTooLarge(const std::vector<std::vector<llama_grammar_element>> &rules, size_t maxClass, std::string &why) {
	for (size_t r = 0; r < rules.size(); r++) {
		const auto &rule = rules[r];
		for (size_t i = 0; i < rule.size(); i++) {
			size_t n = classLen(&rule[i]);
			if (n > maxClass) {
				why = "a character class of " + std::to_string(n) + " elements in rule " + std::to_string(r) + ", more than the " +
					std::to_string(maxClass) + " allowed (use ranges: [a-z], not every letter)";
				return true;
			}
			i += n - 1;
		}
	}
	return false;
}

extern "C" mp_grammar *mp_grammar_new(const struct llama_vocab *vocab, const char *src, char *err, size_t errlen) {
	try {
		llama_grammar_parser parser(vocab);
		if (!parser.parse(src) || parser.rules.empty()) {
			fill(err, errlen, "the grammar does not parse (GBNF syntax, or an undefined rule)");
			return nullptr;
		}
		if (parser.symbol_ids.find("root") == parser.symbol_ids.end()) {
			fill(err, errlen, "the grammar has no rule \"root\"");
			return nullptr;
		}
		std::string why;
		ruleAlts alts(parser.rules.size());
		for (size_t i = 0; i < alts.size(); i++) {
			alts[i] = alternatives(parser.rules[i]);
		}
		if (classTooLarge(parser.rules, MP_GRAMMAR_MAX_CLASS, why) || recursesWithoutInput(alts, why) || advanceTooCostly(alts, MP_GRAMMAR_MAX_STACKS, why)) {
			fill(err, errlen, why);
			return nullptr;
		}
		llama_grammar *g = llama_grammar_init_impl(vocab, nullptr, src, "root", false, nullptr, 0, nullptr, 0);
		if (g == nullptr) {
			fill(err, errlen, "the grammar does not compile (a parse error, an undefined rule, left recursion or no rule \"root\")");
			return nullptr;
		}
		return new mp_grammar{g, vocab};
	} catch (const std::exception &e) {
		fill(err, errlen, e.what());
	} catch (...) {
		fill(err, errlen, "unknown error");
	}
	return nullptr;
}

extern "C" void mp_grammar_free(mp_grammar *g) {
	if (g != nullptr) {
		llama_grammar_free_impl(g->g);
		delete g;
	}
}

extern "C" size_t mp_grammar_stacks(const mp_grammar *g) {
	return g->g->stacks.size();
}

extern "C" size_t mp_grammar_stack_elems(const mp_grammar *g) {
	size_t n = 0;
	for (const auto &st : g->g->stacks) {
		n += st.size();
	}
	return n;
}

extern "C" size_t mp_grammar_class_work(const mp_grammar *g) {
	size_t n = 0;
	for (const auto &st : g->g->stacks) {
		n += st.empty() ? 1 : classLen(st.back());
	}
	return n;
}

extern "C" int mp_grammar_apply(mp_grammar *g, llama_token_data_array *cur, char *err, size_t errlen) {
	try {
		llama_grammar_apply_impl(*g->g, cur);
		return 0;
	} catch (const std::exception &e) {
		fill(err, errlen, e.what());
	} catch (...) {
		fill(err, errlen, "unknown error");
	}
	return -1;
}

extern "C" int mp_grammar_accept(mp_grammar *g, llama_token tok, char *err, size_t errlen) {
	try {
		// Check first: llama.cpp aborts on an end-of-generation token the
		// grammar cannot end at, and throws on a token it cannot accept.
		llama_token_data one = {tok, 0.0f, 0.0f};
		llama_token_data_array arr = {&one, 1, -1, false};
		llama_grammar_apply_impl(*g->g, &arr);
		if (std::isinf(one.logit)) {
			return 1;
		}
		llama_grammar_accept_impl(*g->g, tok);
		return 0;
	} catch (const std::exception &e) {
		fill(err, errlen, e.what());
	} catch (...) {
		fill(err, errlen, "unknown error");
	}
	return -1;
}

extern "C" char *mp_schema_to_grammar(const char *schema, char *err, size_t errlen) {
	try {
		auto js = nlohmann::ordered_json::parse(schema);
		std::string out = json_schema_to_grammar(js, true);
		char *res = (char *)malloc(out.size() + 1);
		if (res == nullptr) {
			fill(err, errlen, "out of memory");
			return nullptr;
		}
		memcpy(res, out.c_str(), out.size() + 1);
		return res;
	} catch (const std::exception &e) {
		fill(err, errlen, e.what());
	} catch (...) {
		fill(err, errlen, "unknown error");
	}
	return nullptr;
}
