#include "storage/s3/xml_reply.h"

#include <libxml/parser.h>

#include <cstring>

namespace dcp::storage::s3 {

const xmlNode* Find(const xmlNode* node, const char* name) {
  for (const xmlNode* n = node; n; n = n->next) {
    if (n->type != XML_ELEMENT_NODE) continue;
    if (std::strcmp(reinterpret_cast<const char*>(n->name), name) == 0) return n;
    if (const xmlNode* c = Find(n->children, name)) return c;
  }
  return nullptr;
}

std::string Text(const xmlNode* n) {
  if (!n) return {};
  xmlChar* s = xmlNodeGetContent(n);
  std::string out = s ? reinterpret_cast<const char*>(s) : "";
  xmlFree(s);
  return out;
}

std::string ChildText(const xmlNode* parent, const char* name) {
  return parent ? Text(Find(parent->children, name)) : std::string();
}

Xml::Xml(const std::string& text)
    : doc(xmlReadMemory(text.data(), static_cast<int>(text.size()), "reply.xml", nullptr,
                        XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING)) {}

Xml::~Xml() {
  if (doc) xmlFreeDoc(doc);
}

const xmlNode* Xml::root() const { return doc ? xmlDocGetRootElement(doc) : nullptr; }

void ForEachTop(const Xml& xml, const char* name, const std::function<void(const xmlNode*)>& fn) {
  const xmlNode* root = xml.root();
  if (!root) return;
  for (const xmlNode* n = root->children; n; n = n->next) {
    if (n->type == XML_ELEMENT_NODE &&
        std::strcmp(reinterpret_cast<const char*>(n->name), name) == 0) {
      fn(n);
    }
  }
}

std::string ErrorCode(const std::string& body) {
  if (body.find("<Error") == std::string::npos) return {};
  Xml xml(body);
  return xml.root() ? ChildText(xml.root(), "Code") : std::string();
}

}  // namespace dcp::storage::s3
