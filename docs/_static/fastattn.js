// Long dotted names (fastattn.flash_attn.flash_attn_with_kvcache) in the page
// title, the sidebars, the breadcrumbs and the previous/next links break at a
// dot first, and after an underscore only where one dotted part alone is
// wider than the line: each part ("flash_attn.") is an inline block
// (fastattn.css) with a <wbr> after each of its underscores. Copying the text
// is unchanged (<wbr> adds nothing).
document.addEventListener("DOMContentLoaded", function () {
  var selectors = [".bd-article h1", ".bd-sidenav a", ".bd-breadcrumbs li",
                   ".prev-next-area .prev-next-title"];
  document.querySelectorAll(selectors.join(", ")).forEach(function (element) {
    var walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    var texts = [];
    while (walker.nextNode()) {
      if (/\w[._]\w/.test(walker.currentNode.nodeValue)) texts.push(walker.currentNode);
    }
    texts.forEach(function (text) {
      var fragment = document.createDocumentFragment();
      // words and the spaces between them; a word with a dot or an
      // underscore inside is split into its parts
      text.nodeValue.split(/(\s+)/).forEach(function (word) {
        if (!/\w[._]\w/.test(word)) {
          fragment.appendChild(document.createTextNode(word));
          return;
        }
        word.split(/(?<=\.)/).forEach(function (part) {
          var span = document.createElement("span");
          span.className = "fa-name-part";
          part.split(/(?<=_)/).forEach(function (piece, i) {
            if (i > 0) span.appendChild(document.createElement("wbr"));
            span.appendChild(document.createTextNode(piece));
          });
          fragment.appendChild(span);
        });
      });
      text.parentNode.replaceChild(fragment, text);
    });
  });
});
