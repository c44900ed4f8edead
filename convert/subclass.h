/* subclass.h - tensor subclasses in a checkpoint: which of its tensors are
 * the inner tensors of one PyTorch tensor subclass (a torchao or
 * optimum-quanto weight), grouped into one image tensor of scheme
 * torch-subclass (formats/scheme.h; docs/QUANT.md, "Tensor subclasses").
 *
 * `arena convert` recognizes three conventions, by what the files say:
 *
 *  - arena's own: a file's __metadata__ key "arena.subclass", a JSON object
 *    {"<tensor>": {"dtype": "BF16", "shape": [..], "subclass": {..},
 *    "components": [["<component>", "<file tensor>"], ...]}, ...}, written
 *    by arena.torch.save_image and by `arena export`. When a file has it,
 *    the two others are not looked for.
 *  - torchao's safetensors (torchao.prototype.safetensors): __metadata__
 *    "tensor_names" and, for each tensor, its JSON {"_type", "_data",
 *    "_tensor_data_names"}; the inner tensors are "<module>._<leaf>_<attr>".
 *    Only the types whose "qdata" has the weight's shape (Float8Tensor,
 *    Int8Tensor, IntxUnpackedToInt8Tensor): another type's metadata does not
 *    give the shape (QUANT_NOT_APPLICABLE, saying to use save_image).
 *  - optimum-quanto's state_dict: "<name>._data" and "<name>._scale" (and
 *    "<name>._shift"), <name> a "*.weight" the file does not hold itself:
 *    a WeightQBytesTensor (qint8, qfloat8), its shape "_data"'s; a packed
 *    "<name>._data._data" (qint4, qint2) does not give the weight's shape
 *    and is refused the same way.
 *
 * The group's first member that the plan meets is planned as the whole
 * tensor (its block is that member's: every member shares the module's
 * prefix); the others are skipped. */
#ifndef ARENA_CONVERT_SUBCLASS_H
#define ARENA_CONVERT_SUBCLASS_H

#include <stddef.h>

#include "../formats/checkpoint.h"
#include "../formats/layout.h"

typedef struct arena_subclass_group {
	char *name; /* owned: the tensor's name */
	arena_dtype dtype;
	uint32_t rank;
	uint64_t shape[ARENA_MAX_RANK];
	char *meta; /* owned: the "subclass" object, compact JSON */
	uint32_t n_comp;
	char comp_name[ARENA_MAX_COMPONENTS][16];
	const arena_st_tensor *comp[ARENA_MAX_COMPONENTS]; /* borrowed from the checkpoint */
	int planned;                                     /* a member was planned as the tensor */
} arena_subclass_group;

typedef struct arena_subclass_set {
	size_t n;
	arena_subclass_group *g;
} arena_subclass_set;

/* Find the groups of `ck`. 0 (s->n may be 0), or ST_BAD_METADATA (a
 * convention's metadata malformed or naming a tensor the files do not
 * hold), QUANT_NOT_APPLICABLE (a subclass whose shape the files do not
 * give, more than ARENA_MAX_COMPONENTS inner tensors, an inner dtype the
 * format has not), DUPLICATE_TENSOR (a group's name is a tensor of the
 * files, or a tensor in two groups), NOMEM; every message names the file. */
int arena_subclass_find(const arena_ckpt *ck, arena_subclass_set *s);
void arena_subclass_free(arena_subclass_set *s);

/* The group `t` is a member of, or NULL. */
arena_subclass_group *arena_subclass_member(const arena_subclass_set *s, const arena_st_tensor *t);

/* Describe the group as the layout tensor t (name, dtype, shape, scheme,
 * components, their sources, the "subclass" JSON). 0, or NOMEM. */
int arena_subclass_describe(const arena_subclass_group *g, arena_tensor *t);

#endif
