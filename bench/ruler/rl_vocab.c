/*
 * The vocabulary of the RULER-style suite's prose generator (rl_text.h):
 * plain English words and invented names, written for this repository.
 * RL_VERB and RL_VERB_BASE are parallel (same index, same verb).
 */
#include <stdlib.h>
#include <string.h>

#include "bench/ruler/rl_text.h"

#define RL_N(a) (sizeof(a) / sizeof((a)[0]))

static const char *const rl_nouns[] = {
    "river", "garden", "lantern", "window", "bridge", "harbor", "meadow", "orchard", "kettle", "ladder", "tower",
    "market", "village", "forest", "valley", "cottage", "chimney", "carriage", "compass", "blanket", "basket",
    "candle", "mirror", "fountain", "engine", "library", "museum", "theater", "station", "workshop", "bakery",
    "school", "chapel", "castle", "island", "canal", "pier", "stable", "barn", "fence", "gate", "road", "path",
    "hill", "cliff", "shore", "lake", "pond", "stream", "field", "farm", "mill", "well", "clock", "bell", "drum",
    "violin", "piano", "painting", "statue", "letter", "journal", "notebook", "map", "ticket", "parcel", "coin",
    "ribbon", "button", "scarf", "jacket", "boot", "hat", "umbrella", "wagon", "bicycle", "boat", "sail", "anchor",
    "rope", "hammer", "saw", "shovel", "bucket", "barrel", "jar", "bottle", "cup", "plate", "spoon", "table",
    "chair", "bench", "shelf", "cabinet", "drawer", "door", "roof", "wall", "floor", "staircase", "balcony",
    "courtyard", "alley", "square", "avenue", "tunnel", "quarry", "mine", "factory", "warehouse", "office",
    "council", "committee", "choir", "orchestra", "crowd", "traveler", "merchant", "farmer", "baker", "sailor",
    "painter", "teacher", "student", "doctor", "gardener", "carpenter", "fisherman", "shepherd", "musician",
    "writer", "neighbor", "stranger", "visitor", "guard", "captain", "clerk", "mayor", "child", "dog", "cat",
    "horse", "goat", "sparrow", "owl", "fox", "rabbit", "deer", "storm", "wind", "rain", "snow", "fog", "cloud",
    "moon", "star", "sunrise", "evening", "harvest", "festival", "parade", "concert", "lesson", "journey",
    "rumor", "story", "song", "recipe", "puzzle", "promise", "secret", "plan", "meeting", "bargain", "lighthouse"};

static const char *const rl_adjs[] = {
    "quiet", "busy", "narrow", "wide", "ancient", "modern", "dusty", "shiny", "crooked", "gentle", "noisy",
    "patient", "curious", "cheerful", "gloomy", "sturdy", "fragile", "heavy", "light", "warm", "chilly", "damp",
    "dry", "bright", "dim", "golden", "silver", "wooden", "stone", "iron", "painted", "faded", "tall", "short",
    "tiny", "enormous", "hidden", "famous", "forgotten", "lonely", "crowded", "empty", "careful", "clumsy",
    "honest", "clever", "stubborn", "polite", "proud", "humble", "restless", "sleepy", "hungry", "thirsty",
    "brave", "timid", "friendly", "distant", "nearby", "northern", "southern", "eastern", "western", "local",
    "foreign", "rare", "common", "simple", "strange", "ordinary", "elegant", "rough", "smooth", "sharp", "dull",
    "fresh", "stale", "sweet", "bitter", "salty", "fragrant", "muddy", "sandy", "rocky", "leafy", "frozen"};

/* Past and base forms, index for index. */
static const char *const rl_verbs[] = {
    "waited", "wandered", "rested", "appeared", "vanished", "returned", "stopped", "turned", "listened", "watched",
    "laughed", "shouted", "whispered", "hurried", "paused", "glowed", "trembled", "settled", "gathered",
    "traveled", "worked", "played", "argued", "agreed", "smiled", "nodded", "waved", "danced", "climbed",
    "drifted", "floated", "rolled", "rattled", "creaked", "sparkled", "faded", "changed", "opened", "closed",
    "collapsed", "improved", "recovered", "arrived", "departed", "lingered", "wondered", "struggled", "relaxed",
    "remained", "moved"};
static const char *const rl_verbs_base[] = {
    "wait", "wander", "rest", "appear", "vanish", "return", "stop", "turn", "listen", "watch", "laugh", "shout",
    "whisper", "hurry", "pause", "glow", "tremble", "settle", "gather", "travel", "work", "play", "argue", "agree",
    "smile", "nod", "wave", "dance", "climb", "drift", "float", "roll", "rattle", "creak", "sparkle", "fade",
    "change", "open", "close", "collapse", "improve", "recover", "arrive", "depart", "linger", "wonder",
    "struggle", "relax", "remain", "move"};

static const char *const rl_advs[] = {
    "slowly", "quickly", "quietly", "loudly", "suddenly", "gently", "carefully", "happily", "sadly", "patiently",
    "eagerly", "calmly", "briefly", "rarely", "often", "nervously", "proudly", "silently", "steadily", "lazily",
    "boldly", "gracefully", "awkwardly", "politely", "cheerfully"};

static const char *const rl_places[] = {
    "Ashford", "Brindlemere", "Caldwick", "Dunmore", "Eastbrook", "Fennick", "Glenhaven", "Harrowgate",
    "Ivybridge", "Juniper Falls", "Kestrel Bay", "Larkfield", "Marlow", "Northcote", "Oakridge", "Pellham",
    "Quarry Hill", "Redwater", "Stillwell", "Thornbury", "Upton Marsh", "Valewood", "Westmoor", "Yarrow",
    "Ambleside", "Birchwood", "Cobblestone", "Dovecote", "Elmstead", "Foxglove", "Greyhaven", "Hollowmere"};

static const char *const rl_firsts[] = {
    "Alice", "Bernard", "Clara", "Desmond", "Eleanor", "Felix", "Greta", "Harold", "Iris", "Julian", "Katrina",
    "Leonard", "Mabel", "Nathan", "Olive", "Percy", "Rosalind", "Samuel", "Theodora", "Victor", "Winifred",
    "Arthur", "Beatrice", "Cyril", "Dorothy", "Edmund", "Florence", "Gilbert", "Hazel", "Ivan", "Josephine",
    "Lionel", "Matilda", "Oscar", "Penelope", "Rupert", "Sylvia", "Tobias", "Ursula", "Walter"};

static const char *const rl_lasts[] = {
    "Abernathy", "Blackwood", "Calloway", "Dunstan", "Ellsworth", "Fairbanks", "Goodwin", "Hargreaves",
    "Ingram", "Jessop", "Kingsley", "Lockhart", "Merriweather", "Northam", "Oakley", "Pemberton", "Quimby",
    "Radcliffe", "Sutherland", "Thistlewood", "Underhill", "Vance", "Whitlock", "Yardley", "Ashcombe",
    "Brightwater", "Cresswell", "Dalrymple", "Everleigh", "Fennimore"};

static const char *const rl_times[] = {
    "that evening", "the next morning", "at dawn", "before noon", "late at night", "after supper",
    "during the winter", "in the spring", "last summer", "every autumn", "on a rainy afternoon",
    "just before sunset", "some years ago", "the following week", "at the end of the day", "long ago"};

static const char *const rl_preps[] = {"near", "behind", "beside", "beyond", "under", "above", "across",
                                       "around", "inside", "along", "past", "toward"};

static const char *const rl_days[] = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
                                      "Sunday", "spring", "summer", "autumn", "winter", "holiday"};

static const char *const rl_months[] = {"January", "February", "March", "April", "May", "June", "July",
                                        "August", "September", "October", "November", "December"};

static const char *const rl_colors[] = {"red", "blue", "green", "yellow", "purple", "orange", "white", "black",
                                        "grey", "brown", "pink", "turquoise", "crimson", "olive", "navy"};

static const char *const rl_animals[] = {"parrot", "tortoise", "ferret", "hedgehog", "goose", "donkey", "peacock",
                                         "lizard", "hamster", "pony", "raven", "beagle", "goldfish", "lamb"};

static const char *const rl_numwords[] = {"three", "four", "five", "six", "seven", "eight", "nine", "ten",
                                          "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                                          "seventeen", "eighteen", "nineteen"};

static const struct {
    const char *const *w;
    size_t n;
} rl_lists[RL_N_WORDLISTS] = {
    [RL_NOUN] = {rl_nouns, RL_N(rl_nouns)},         [RL_ADJ] = {rl_adjs, RL_N(rl_adjs)},
    [RL_VERB] = {rl_verbs, RL_N(rl_verbs)},         [RL_VERB_BASE] = {rl_verbs_base, RL_N(rl_verbs_base)},
    [RL_ADV] = {rl_advs, RL_N(rl_advs)},            [RL_PLACE] = {rl_places, RL_N(rl_places)},
    [RL_FIRST] = {rl_firsts, RL_N(rl_firsts)},      [RL_LAST] = {rl_lasts, RL_N(rl_lasts)},
    [RL_TIME] = {rl_times, RL_N(rl_times)},         [RL_PREP] = {rl_preps, RL_N(rl_preps)},
    [RL_DAY] = {rl_days, RL_N(rl_days)},            [RL_MONTH] = {rl_months, RL_N(rl_months)},
    [RL_COLOR] = {rl_colors, RL_N(rl_colors)},      [RL_ANIMAL] = {rl_animals, RL_N(rl_animals)},
    [RL_NUMWORD] = {rl_numwords, RL_N(rl_numwords)},
};

_Static_assert(RL_N(rl_verbs) == RL_N(rl_verbs_base), "verb forms are parallel");

size_t rl_words_n(rl_wordlist_t w)
{
    return rl_lists[w].n;
}

const char *rl_word_at(rl_wordlist_t w, size_t i)
{
    return rl_lists[w].w[i % rl_lists[w].n];
}

const char *rl_word(rl_rng_t *r, rl_wordlist_t w)
{
    return rl_lists[w].w[rl_rng_below(r, (uint32_t)rl_lists[w].n)];
}

const char *const *rl_words_distinct(size_t *n_p)
{
    /* Built once (the bench is single-threaded); static storage. */
    static const char *all[RL_N(rl_nouns) + RL_N(rl_adjs) + RL_N(rl_verbs_base)];
    static size_t n_all;
    if (n_all == 0) {
        const rl_wordlist_t from[] = {RL_NOUN, RL_ADJ, RL_VERB_BASE};
        for (size_t f = 0; f < RL_N(from); f++)
            for (size_t i = 0; i < rl_lists[from[f]].n; i++) {
                const char *w = rl_lists[from[f]].w[i];
                bool dup = false;
                for (size_t j = 0; j < n_all && !dup; j++)
                    dup = strcmp(all[j], w) == 0;
                if (!dup)
                    all[n_all++] = w;
            }
    }
    *n_p = n_all;
    return all;
}
